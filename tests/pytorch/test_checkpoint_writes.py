"""A checkpoint write that fails (a file-size limit via RLIMIT_FSIZE) leaves the previous checkpoint
loadable and ends training with one line naming the file and the cause, exit 2 (CPU)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def _run(argv: list[str], *, cwd: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    """``python argv`` whose files may not grow beyond ``limit`` bytes (writes then fail with EFBIG)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, preexec_fn=apply if limit else None)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.strip().splitlines() if "error:" in line or "Traceback" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def trained_run(tiny_classification, tmp_path_factory) -> Path:
    """One epoch of small_cnn at 32 px: checkpoint_last.pth and checkpoint_best.pth."""
    run = tmp_path_factory.mktemp("run") / "run"
    proc = _run(["-m", "crossdali", "train", "classification", "--framework", "pytorch", "--data",
                 str(tiny_classification / "imagefolder"), "--arch", "small_cnn", "--crop-size", "32", "--epochs", "1",
                 "-b", "32", "--skip-check", "--output-dir", str(run)], cwd=run.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.slow
def test_a_checkpoint_write_over_the_limit_keeps_the_previous_one(trained_run, tiny_classification, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint_last.pth", "metrics.jsonl"):
        (run / name).write_bytes((trained_run / name).read_bytes())
    before = (run / "checkpoint_last.pth").read_bytes()
    limit = len(before) // 2  # metrics.jsonl stays far below it; the next checkpoint cannot be written
    proc = _run(["-m", "crossdali", "train", "classification", "--framework", "pytorch", "--data",
                 str(tiny_classification / "imagefolder"), "--arch", "small_cnn", "--crop-size", "32", "--epochs", "2",
                 "-b", "32", "--skip-check", "--resume", str(run / "checkpoint_last.pth")], cwd=tmp_path, limit=limit)
    line = _one_line(proc)
    assert f"cannot write checkpoint {run / 'checkpoint_last.pth'}: File too large; the previous checkpoint_last.pth " \
           "is unchanged" in line, line
    assert (run / "checkpoint_last.pth").read_bytes() == before
    assert torch.load(run / "checkpoint_last.pth", weights_only=True)["epoch"] == 1
    assert not list(run.glob(".*.tmp-*"))
