"""Benchmark scripts behind docs/benchmarks.md (``python -m benchmarks.<name>``, or ``crossdali bench <name>``).

Each writes ``<name>.json`` (+ a PNG) into ``results/latest`` unless ``--out`` says otherwise; every JSON names the
GPU it ran on. ``benchmarks/run_on_gpu.sh`` runs them all on a GPU machine; ``benchmarks/probes/`` holds
one-question probes of DALI's behaviour that the code and docs cite."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path


def usage_error(message: str) -> SystemExit:
    """One line on stderr and exit code 2, the project's rule for a user's mistake (e.g. a GPU
    benchmark started where there is no GPU): ``raise usage_error("...")``."""
    print(message, file=sys.stderr)
    return SystemExit(2)


def round_spread(values: list[float]) -> dict:
    """A ratio measured once per interleaved round: its mean, min, max and the number of rounds."""
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "rounds": len(values)}


def gpu_name() -> str | None:
    """GPU 0's model as ``nvidia-smi`` names it (no framework imported), ``None`` where there is none: every
    benchmark's JSON records the GPU it ran on."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    names = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    return names[0] if names else None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else what ``platform`` knows): CPU rows name the CPU they ran on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench_set(size: str = "bench") -> Path:
    """The classification sample set of ``size`` (built if missing, JPEG folders only): the training benchmarks
    read it through ``--data``, as a user's own data would be."""
    from crossdali.common.data.sample_data import ensure_classification

    return ensure_classification(size=size, formats=("imagefolder",)) / "imagefolder"
