"""The GPU's engine load (SMs, NVDEC, NVJPG, ...) recorded beside every benchmark row.

``nvidia-smi dmon -s u`` prints one line of utilisation percentages per second; a background thread
stamps each line with ``time.perf_counter()`` as it arrives, so a row that knows its own start and
end gets the mean load of its window::

    with EngineLoad(log=out / "dmon.log") as load:
        t0 = time.perf_counter(); run_row(); row["engine_load"] = load.mean(t0, time.perf_counter())

A decoder benchmark says little unless it shows whether the engines were busy.
Where ``nvidia-smi`` is missing (CPU machines, CI) every ``mean`` is ``None`` and nothing runs.
Parsing dmon's text by hand: NVML's Python binding (``pynvml``) is not always installed beside the
frameworks, and dmon's text is what a user can compare with by running it themselves.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path


def _percent(field: str) -> float:
    """One dmon value; "-" (an engine this GPU lacks) becomes NaN, left out of the means."""
    try:
        return float(field)
    except ValueError:
        return float("nan")


class EngineLoad:
    """``nvidia-smi dmon -s u -i GPU`` in the background; ``mean(t0, t1)`` per column over a window."""

    def __init__(self, *, log: Path | None = None, gpu: int = 0) -> None:
        self.log, self.gpu = log, gpu
        self.columns: list[str] = []
        self.samples: list[tuple[float, list[float]]] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._proc is not None

    def __enter__(self) -> EngineLoad:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return self
        try:
            self._proc = subprocess.Popen([exe, "dmon", "-s", "u", "-i", str(self.gpu)], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True, bufsize=1)
        except OSError:
            return self
        self._thread = threading.Thread(target=self._read, name="engine-load", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        sink = self.log.open("w") if self.log else None
        try:
            for line in self._proc.stdout:
                stamp = time.perf_counter()
                if sink:
                    sink.write(f"{stamp:.3f} {line}")
                    sink.flush()
                fields = line.split()
                if not fields:
                    continue
                if fields[0] == "#":
                    if not self.columns and len(fields) > 2 and fields[1] == "gpu":
                        self.columns = fields[2:]  # "# gpu sm mem enc dec jpg ofa"
                    continue
                self.samples.append((stamp, [_percent(v) for v in fields[1:]]))
        finally:
            if sink:
                sink.close()

    def mean(self, start: float, end: float) -> dict[str, float] | None:
        """Mean percent per engine over the samples stamped in [start, end] (``None`` without dmon)."""
        if not self.available or not self.columns:
            return None
        rows = [v for t, v in list(self.samples) if start <= t <= end]
        if not rows:
            return {"samples": 0}
        out: dict[str, float] = {"samples": len(rows)}
        for i, name in enumerate(self.columns):
            vals = [r[i] for r in rows if i < len(r) and r[i] == r[i]]
            if vals:
                out[name] = round(sum(vals) / len(vals), 1)
                out[f"{name}_max"] = max(vals)
        return out

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)
