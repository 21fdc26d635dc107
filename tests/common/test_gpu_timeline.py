"""benchmarks.gpu_timeline's summary of an nsys SQLite export: training epochs found among the other stretches,
DALI's streams told from the framework's, a step's idle time split into short and long gaps, and its usage
errors. The export is built here with the tables and columns nsys writes (the GPU trace itself needs a GPU)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_timeline import compare, read_trace, summarize

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000  # nsys timestamps are nanoseconds
STEPS, KERNELS, KERNEL_NS, SHORT_NS, LONG_NS = 4, 5, 200_000, 2_000, 300_000


def _export(path: Path, *, with_dali: bool) -> Path:
    """A start-up stretch, three training epochs of STEPS steps (KERNELS framework kernels each, SHORT_NS apart,
    LONG_NS between steps), a validation stretch after each epoch and, ``with_dali``, a DALI resize and an
    nvJPEG conversion per step on two other streams, each beside a framework kernel, and one copy per step."""
    names = {1: "sm90_xmma_gemm_bf16", 2: "void dali::kernels::ResampleKernel<float>", 3: "void nvjpeg::rgba2rgb<5>",
             4: "loop_add_fusion"}
    kernels, copies, t = [], [], 0
    for _ in range(3):  # start-up: three kernels
        kernels.append((t, t + KERNEL_NS, 7, 4))
        t += KERNEL_NS + SHORT_NS
    for _ in range(3):
        t += 50 * MS  # compilation / the previous validation: an idle stretch
        for step in range(STEPS):
            if step:
                t += LONG_NS - SHORT_NS
            for k in range(KERNELS):
                kernels.append((t, t + KERNEL_NS, 7, 1))
                if with_dali and k == 1:
                    kernels.append((t, t + 10_000, 9, 2))
                    kernels.append((t + 20_000, t + 27_000, 11, 3))
                    copies.append((t, t + 50_000, 9, 1, 2_000_000))
                t += KERNEL_NS + SHORT_NS
            if step == STEPS - 1:
                t -= SHORT_NS
        t += 30 * MS
        for _ in range(2):  # validation: fewer kernels than an epoch
            kernels.append((t, t + KERNEL_NS, 7, 4))
            t += KERNEL_NS + SHORT_NS
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, streamId INTEGER, "
               "demangledName INTEGER, shortName INTEGER)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, streamId INTEGER, "
               "copyKind INTEGER, bytes INTEGER)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", names.items())
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?)", [(*k, k[3]) for k in kernels])
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?, ?)", copies)
    db.commit()
    db.close()
    return path


def test_summary_finds_the_training_epochs_and_splits_a_step(tmp_path):
    kernels, copies = read_trace(_export(tmp_path / "dali.sqlite", with_dali=True))
    report = summarize(kernels, copies, epochs=3, steps_per_epoch=STEPS)
    assert report["dali_streams"] == 2  # DALI's resize and nvJPEG's conversion ran on streams of their own
    assert [e["framework_kernels"] for e in report["epochs"]] == [STEPS * KERNELS] * 3  # not start-up, not validation
    assert report["timed_epochs"] == [2, 3]
    step = report["per_step"]
    assert step["framework_busy_ms"] == pytest.approx(KERNELS * KERNEL_NS / MS)
    assert step["idle_short_gaps_ms"] == pytest.approx((KERNELS - 1) * SHORT_NS / MS)
    assert step["idle_long_gaps_ms"] == pytest.approx((STEPS - 1) * LONG_NS / STEPS / MS)
    assert step["step_ms"] == pytest.approx(step["framework_busy_ms"] + step["idle_ms"])
    assert step["dali_launches"] == 2 and step["dali_kernel_ms"] == pytest.approx(0.017)
    assert [k["name"] for k in report["dali_kernels_per_step"]] == [
        "void dali::kernels::ResampleKernel<float>", "void nvjpeg::rgba2rgb<5>"]
    epoch = report["epochs"][1]
    assert epoch["dali_beside_framework_ms"] == pytest.approx(STEPS * 0.017)
    assert epoch["copies"] == {"dali_host_to_device": {"count": STEPS, "MB": 8.0, "ms": 0.2}}


def test_compare_gives_what_dali_adds_to_a_step(tmp_path):
    rows = {backend: summarize(*read_trace(_export(tmp_path / f"{backend}.sqlite", with_dali=backend != "synthetic")),
                               epochs=3, steps_per_epoch=STEPS)
            for backend in ("synthetic", "dali-gpu")}
    added = compare(rows)["dali-gpu"]
    assert added["dali_kernel_ms"] == pytest.approx(0.017)
    assert added["framework_busy_ms"] == pytest.approx(0.0) and added["step_ms"] == pytest.approx(0.0)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_timeline", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_summarize_command_writes_the_json(tmp_path):
    trace = _export(tmp_path / "run.sqlite", with_dali=True)
    proc = _cli("--summarize", str(trace), "--epochs", "3", "--steps-per-epoch", str(STEPS), "--out", str(tmp_path),
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    written = json.loads((tmp_path / "gpu_timeline_run.json").read_text())
    assert written["per_step"]["dali_launches"] == 2
    assert "DALI kernels 0.02 ms in 2 launches" in proc.stdout


@pytest.mark.parametrize("make, args, says", [
    (lambda p: p / "missing.sqlite", ["--epochs", "3"], "no such file"),
    (lambda p: sqlite3.connect(p / "empty.sqlite").close() or p / "empty.sqlite", ["--epochs", "3"],
     "not an nsys SQLite export"),
    (lambda p: _export(p / "run.sqlite", with_dali=False), ["--epochs", "1"], "--epochs 1: give at least 2"),
    (lambda p: _export(p / "run.sqlite", with_dali=False), ["--epochs", "9"], "fewer than --epochs 9"),
    (None, ["--nsys", "/nonexistent/nsys"], "nsys not found"),
    (None, ["--nsys", "/bin/sh"], "no GPU here"),
])
def test_usage_errors_are_one_line(tmp_path, make, args, says):
    extra = ["--summarize", str(make(tmp_path))] if make is not None else []
    proc = _cli(*extra, *args, "--out", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
