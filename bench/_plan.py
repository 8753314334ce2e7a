"""What a benchmark run measures and how often: the sections and the per-repetition counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

SECTION_NAMES = ("broker_tools", "cold", "cli", "calls", "tool_sandbox", "broker", "egress", "files", "warm",
                 "concurrency")
"""Every section, in the order they run (`--sections` takes these names)."""

HOST_ONLY = frozenset({"broker_tools"})
"""Sections without a sandbox: measured once per repetition under the runtime name "host"."""


@dataclass(frozen=True)
class Plan:
    """Repetitions of every section, and the counts of one repetition. Smoke proves the code runs; full
    gives medians whose spread over the repetitions says how far to trust them."""

    reps: int
    cold: int
    calls: int
    calls_warmup: int
    broker: int
    broker_warmup: int
    levels: tuple[int, ...]
    warm: int
    filler: int
    pool: int
    settle: float
    quiet: bool
    """Wait for a calm machine before each measurement (and between concurrency levels)."""
    egress: int = 8
    """HTTPS requests of the egress section, each way, per repetition."""
    downloads: int = 1
    """64 MiB downloads of the egress section, each way, per repetition."""
    files_count: int = 200
    """Files in the files section's workspace tree."""
    files_mib: int = 8
    """MiB in the files section's workspace tree."""
    files_warm: int = 2
    """Warm runs of the files section, each way, per repetition."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(**{**data, "levels": tuple(int(n) for n in data["levels"])})


SMOKE = Plan(reps=2, cold=1, calls=10, calls_warmup=3, broker=2, broker_warmup=1, levels=(2,), warm=2,
             filler=2, pool=2, settle=0.2, quiet=False, egress=8, downloads=1, files_count=200, files_mib=8,
             files_warm=2)
# Per repetition; x3 gives about the sample counts of the single-pass runs before (cold 20, calls 300,
# broker 50 (now 120: its overheads are differences of two medians), warm 30, two batches per
# concurrency level).
FULL = Plan(reps=3, cold=7, calls=100, calls_warmup=20, broker=40, broker_warmup=5, levels=(16, 32, 64),
            warm=10, filler=3, pool=4, settle=0.3, quiet=True, egress=200, downloads=3, files_count=5000,
            files_mib=200, files_warm=10)


def parse_sections(text: str | None) -> tuple[str, ...]:
    """`--sections a,b` in run order; every section when not given."""
    if not text:
        return SECTION_NAMES
    wanted = {s.strip() for s in text.split(",") if s.strip()}
    unknown = sorted(wanted - set(SECTION_NAMES))
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTION_NAMES)}")
    return tuple(s for s in SECTION_NAMES if s in wanted)


CALL_ROUNDS = 4
"""Rounds the calls section splits its calls into: each round measures the tool call and every floor once,
in a rotated order, so the figures a ratio divides span the same minutes (the machine drifts between
minutes by more than the differences measured)."""


__all__ = ["CALL_ROUNDS", "FULL", "HOST_ONLY", "SECTION_NAMES", "SMOKE", "Plan", "parse_sections"]
