"""The admin API: the long-running host (serve), its wire, and the blocking and asyncio clients."""
