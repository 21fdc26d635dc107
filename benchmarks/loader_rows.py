"""What the loader benchmarks share: the machine header of a report, timing whole epochs of a
loader, and running a list of rows where one failing row is recorded and the others still run."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch


def environment(module: str, device: torch.device) -> dict:
    """The head of a report: the benchmark, its exact command, and the machine and versions."""
    return {
        "benchmark": module,
        "command": " ".join(["python", "-m", f"benchmarks.{module}", *sys.argv[1:]]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "dali": __import__("nvidia.dali").dali.__version__,
        # CUDA's hardware queues (crossdali.common.loading.cuda_queues): unset means CUDA's 8
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_epochs(loader, device: torch.device, *, min_epochs: int = 2, min_seconds: float = 0.0,
                max_seconds: float | None = None) -> dict[str, float]:
    """One warm-up epoch, then whole epochs, moving each batch to ``device``, until at least
    ``min_epochs`` epochs and ``min_seconds`` seconds are timed (a GPU pipeline goes through the
    bench set in under a second, too short to time alone). ``max_seconds``: a slow loader stops there,
    inside an epoch if need be (its warm-up at a quarter of it), and ``epochs`` counts the whole ones."""
    t0 = time.perf_counter()
    for images, _labels in loader:  # warm-up: workers, caches, allocator
        images.to(device, non_blocking=True)
        if max_seconds is not None and time.perf_counter() - t0 > max_seconds / 4:
            break
    sync(device)
    n, epochs, start, capped = 0, 0, time.perf_counter(), False
    while not capped and (epochs < min_epochs or time.perf_counter() - start < min_seconds):
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            n += images.shape[0]
            if max_seconds is not None and time.perf_counter() - start > max_seconds:
                capped = True
                break
        sync(device)
        epochs += not capped
    elapsed = time.perf_counter() - start
    return {"images": n, "epochs": epochs, "seconds": elapsed, "img_s": n / elapsed, "capped": capped}


def write_report(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=2) + "\n")


def run_rows(rows: Iterable[tuple[dict, Callable[[], object]]], *, device: torch.device, min_seconds: float,
             report: dict, path: Path, width: int = 60) -> None:
    """Time each ``(row, make_loader)`` with :func:`time_epochs` into ``report["results"]``, writing
    the JSON after every row so a run cut short keeps what it measured; a row that fails records
    its error and the next one runs."""
    for row, make in rows:
        try:
            loader = make()
            row.update(time_epochs(loader, device, min_seconds=min_seconds))
            print(f"{row['name']:{width}s} {row['img_s']:9,.0f} img/s", flush=True)
            del loader
        except Exception as e:  # reported in the JSON
            row["error"] = f"{type(e).__name__}: {e}"
            print(f"{row['name']:{width}s} FAILED: {row['error']}", flush=True)
        report["results"].append(row)
        write_report(path, report)
