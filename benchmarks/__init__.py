"""Benchmark scripts behind the README's numbers (``python -m benchmarks.<name>``, or ``crossdali bench <name>``)."""

from __future__ import annotations

import sys


def usage_error(message: str) -> SystemExit:
    """One line on stderr and exit code 2, the project's rule for a user's mistake (e.g. a GPU
    benchmark started where there is no GPU): ``raise usage_error("...")``."""
    print(message, file=sys.stderr)
    return SystemExit(2)


def round_spread(values: list[float]) -> dict:
    """A ratio measured once per interleaved round: its mean, min, max and the number of rounds."""
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "rounds": len(values)}
