"""Benchmark scripts behind the README's numbers (``python -m benchmarks.<name>``, or ``crossdali bench <name>``)."""

from __future__ import annotations

import sys


def usage_error(message: str) -> SystemExit:
    """One line on stderr and exit code 2, the project's rule for a user's mistake (e.g. a GPU
    benchmark started where there is no GPU): ``raise usage_error("...")``."""
    print(message, file=sys.stderr)
    return SystemExit(2)
