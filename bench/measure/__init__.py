"""The measurements, one module per section (bench/report/ renders each; shared.py serves several)."""
