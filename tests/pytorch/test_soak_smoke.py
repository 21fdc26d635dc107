"""The soak benchmark's CPU form (docs/benchmarks.md#soak): the PyTorch script and the bare loader run for a fixed
wall time on the tiny set with dali-cpu, memory is sampled at the start, every interval and at the end, and the
JSON says how much it grew after the warm-up."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")

ROOT = Path(__file__).resolve().parents[2]


def _soak(out: Path, data_root: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--smoke", "--out", str(out), *extra], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    path = out / "soak.json"
    return proc, json.loads(path.read_text()) if path.exists() else None


def _check_report(report: dict, *, seconds: float, every: float) -> None:
    samples = report["samples"]
    # a sample at the start, one per interval, one at the deadline (the last interval may be shorter)
    assert len(samples) == int(seconds // every) + 1 + (seconds % every > 0), samples
    assert samples[0]["t_s"] < 1 and samples[-1]["t_s"] >= seconds - 1, samples
    assert all(s["host_rss_mib"] > 100 for s in samples), samples  # torch and DALI alone take more
    assert all(s["gpu_used_mib"] is None and s["torch_reserved_mib"] is None for s in samples)  # no GPU here
    assert samples[-1]["images"] > 0 and samples[-1]["img_s"] is not None
    assert report["dali"] and report["cpu"] and report["cpu_count"] and report["backend"] == "dali-cpu"
    assert report["command"].startswith("python -m benchmarks.soak --smoke")
    host = report["growth"]["host_rss_mib"]
    warm = next(s for s in samples if s["t_s"] >= report["warmup_s"])
    assert host["at_warmup_mib"] == warm["host_rss_mib"] and host["last_mib"] == samples[-1]["host_rss_mib"]
    assert host["growth"] == pytest.approx((host["last_mib"] - host["at_warmup_mib"]) / host["at_warmup_mib"], abs=1e-4)
    assert host["under_5_percent"] == (host["growth"] < 0.05)
    assert report["growth"]["gpu_used_mib"] is None and report["growth"]["torch_reserved_mib"] is None
    assert report["memory_flat"] == host["under_5_percent"]


@pytest.mark.slow
def test_soak_trains_for_the_given_time_and_records_memory(tmp_path, data_root):
    proc, report = _soak(tmp_path, data_root, "--minutes", "0.5", "--every", "5")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check_report(report, seconds=30, every=5)
    assert report["mode"] == "train" and "--data-backend dali-cpu" in report["runs"]
    assert report["warmup_s"] == 10  # 2 intervals: more than 20 % of 30 s
    if importlib.util.find_spec("matplotlib"):  # the plot is optional, like matplotlib
        assert (tmp_path / "soak.png").stat().st_size > 10_000


@pytest.mark.slow
def test_soak_iterates_the_loader_over_epochs(tmp_path, data_root):
    proc, report = _soak(tmp_path, data_root, "--mode", "loader", "--minutes", "0.25", "--every", "4")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _check_report(report, seconds=15, every=4)
    assert report["mode"] == "loader" and report["samples"][-1]["epochs"] >= 2  # epoch boundaries were crossed


def test_soak_refuses_a_bad_interval_in_one_line(tmp_path, data_root):
    proc, report = _soak(tmp_path, data_root, "--minutes", "0.1", "--every", "30")
    assert proc.returncode == 2 and "--every 30" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert report is None
