"""Failed writes are harmless: a checkpoint or check report that cannot be written (a file-size limit
via RLIMIT_FSIZE, a folder that is not one) leaves the previous file as it was and ends the run with
one line naming the file and the cause, exit 2; a truncated or damaged checkpoint given to --resume
or predict is one line, exit 2. Everything runs on the CPU."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _limited(limit: int):
    """preexec_fn: files of this process may not grow beyond ``limit`` bytes (writes fail with EFBIG)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def _run(argv: list[str], *, cwd: Path, limit: int | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                          preexec_fn=_limited(limit) if limit else None)


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.strip().splitlines() if "error:" in line or "Traceback" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def test_write_atomically_keeps_the_previous_file(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("previous")
    code = ("import sys\nfrom pathlib import Path\nfrom crossdali.common.files import WriteError, write_text_atomically\n"
            "try:\n    write_text_atomically(Path(sys.argv[1]), 'x' * 100_000, what='check report')\n"
            "except WriteError as e:\n    print(e)\n")
    proc = _run(["-c", code, str(target)], cwd=ROOT, limit=10_000)
    assert proc.stdout.strip() == f"cannot write check report {target}: File too large; the previous report.json is " \
                                  "unchanged", proc.stdout + proc.stderr
    assert target.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_metrics_record_over_the_limit_names_the_file(tmp_path):
    code = ("import sys\nfrom crossdali.common.errors import WriteError\n"
            "from crossdali.common.scripts.metrics import MetricsWriter\nw = MetricsWriter(sys.argv[1])\n"
            "try:\n    for i in range(100):\n        w.write(event='step', step=i, note='x' * 100)\n"
            "except WriteError as e:\n    print(e)\n")
    proc = _run(["-c", code, str(tmp_path)], cwd=ROOT, limit=1_000)
    assert proc.stdout.strip() == f"cannot write {tmp_path / 'metrics.jsonl'}: File too large", proc.stdout + proc.stderr


def test_check_report_under_a_file_size_limit_is_one_line(tiny_classification, tmp_path):
    out = tmp_path / "check"
    out.mkdir()
    (out / "report.json").write_text("previous")
    proc = _run(["-m", "crossdali", "check", str(tiny_classification / "imagefolder"), "--output-dir", str(out),
                 "--no-cache", "--no-progress"], cwd=tmp_path, limit=300)  # the report is about 700 bytes
    line = _one_line(proc)
    assert line == f"crossdali check: error: cannot write check report {out / 'report.json'}: File too large; the " \
                   "previous report.json is unchanged", line
    assert (out / "report.json").read_text() == "previous" and sorted(p.name for p in out.iterdir()) == ["report.json"]


def test_an_output_dir_that_cannot_be_a_folder_is_one_line(tiny_classification, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "afile").write_text("not a folder")
    proc = _run(["-m", "crossdali", "train", "classification", "--framework", "pytorch", "--data",
                 str(tiny_classification / "imagefolder"), "--arch", "small_cnn", "--crop-size", "32", "--epochs", "1",
                 "-b", "32", "--output-dir", str(tmp_path / "afile" / "run")], cwd=tmp_path)
    line = _one_line(proc)
    assert str(tmp_path / "afile") in line and "Not a directory" in line, line


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_checkpoint_is_one_line_for_resume_and_predict(tiny_classification, tmp_path, damage):
    torch = pytest.importorskip("torch")
    from crossdali.pytorch.models import create_model

    whole = tmp_path / "whole.pth"  # what the scripts save, less the optimizer and loader state
    torch.save({"model": create_model("resnet18", num_classes=11).state_dict(), "arch": "resnet18", "num_classes": 11,
                "config": {"arch": "resnet18", "crop_size": 32, "num_classes": 11}}, whole)
    data = whole.read_bytes()
    if damage == "truncated":
        data = data[:len(data) // 3]
    else:  # bytes inverted all over the first 200 kB: torch.load fails inside its reader
        data = bytearray(data)
        for i in range(2000, 200_000, 997):
            data[i] ^= 0xFF
        data = bytes(data)
    bad = tmp_path / "checkpoint_last.pth"
    bad.write_bytes(data)
    resume = _one_line(_run(["-m", "crossdali", "train", "classification", "--framework", "pytorch", "--data",
                             str(tiny_classification / "imagefolder"), "--arch", "small_cnn", "--epochs", "2",
                             "--resume", str(bad)], cwd=tmp_path))
    image = next((tiny_classification / "imagefolder" / "val").glob("*/*.jpg"))
    predict = _run(["-m", "crossdali", "predict", str(bad), str(image)], cwd=tmp_path)
    assert predict.returncode == 2 and len(predict.stderr.strip().splitlines()) == 1, predict.stderr
    for line in (resume, predict.stderr.strip()):
        assert str(bad) in line, line
    if damage == "truncated":
        assert "is truncated" in predict.stderr and "is truncated" in resume, (resume, predict.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("framework, module, arch", [("tensorflow", "tensorflow", "small_cnn"), ("jax", "flax", "small_cnn"),
                                                     ("mxnet", "mxnet", "mobilenet0.25")])
def test_a_checkpoint_over_the_limit_is_one_line_in_every_framework(framework, module, arch, tiny_classification,
                                                                     tmp_path):
    """Each script's first checkpoint under a 100 kB file-size limit (metrics.jsonl stays below it)."""
    pytest.importorskip(module)
    out = tmp_path / "run"
    proc = _run(["-m", "crossdali", "train", "classification", "--framework", framework, "--data",
                 str(tiny_classification / "imagefolder"), "--arch", arch, "--crop-size", "32", "--epochs", "1",
                 "-b", "32", "--skip-check", "--output-dir", str(out)], cwd=tmp_path, limit=100_000)
    line = _one_line(proc)
    assert "cannot write checkpoint" in line and str(out) in line, line
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]  # no temporary file left behind
