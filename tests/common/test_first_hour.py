"""What a new user meets first: messages that name files (never object reprs), counts in
grammatical English, a bad sample found by DALI with ``--skip-check`` named alone, and no run
folder left behind by a run that a user's mistake stopped before anything could be resumed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.data.check.images import inspect_image
from crossdali.common.scripts.metrics import MetricsWriter, discard_unstarted_runs
from crossdali.common.scripts.runs import format_summary

ROOT = Path(__file__).resolve().parents[2]
RANDOM_BYTES = bytes(range(7, 256)) * 20  # not a header any decoder knows


def test_a_file_no_decoder_knows_is_named_without_pillows_stream_repr():
    (code, message), = inspect_image(RANDOM_BYTES, extension=".jpg").problems
    assert code == "not-an-image" and "object at 0x" not in message and "BytesIO" not in message, message


def test_one_epoch_is_singular():
    summary = {"epochs": 1, "train_seconds": 3.0, "eval_seconds": 1.0, "best": None, "mean_samples_s": None}
    assert format_summary(summary, run_dir=Path("r"), files=[]).startswith("done: 1 epoch, ")


def test_a_writer_that_only_started_leaves_nothing(tmp_path):
    run = tmp_path / "runs" / "classification-x"
    writer = MetricsWriter(run)
    writer.write(event="start")
    writer.write(event="step", step=1)
    kept = MetricsWriter(tmp_path / "kept")
    kept.write(event="start")
    kept.write(event="epoch", epoch=1)
    removed = discard_unstarted_runs()
    assert not (tmp_path / "runs").exists() and set(removed) == {run / "metrics.jsonl", run, tmp_path / "runs"}
    assert (tmp_path / "kept" / "metrics.jsonl").is_file()
    # a folder that held something before (or got a checkpoint) stays; only what the writer made goes
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    MetricsWriter(tmp_path / "mine").write(event="start")
    with_ckpt = MetricsWriter(tmp_path / "ckpt")
    with_ckpt.write(event="start")
    (tmp_path / "ckpt" / "checkpoint_last.pth").write_bytes(b"0")
    discard_unstarted_runs()
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    assert (tmp_path / "ckpt" / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_skip_check_names_only_the_bad_file_and_leaves_no_run_folder(tiny_classification, tmp_path):
    """The README's case: one random-bytes .jpg in an ImageFolder, training with --skip-check."""
    pytest.importorskip("torch")
    data = tmp_path / "data"
    shutil.copytree(tiny_classification / "imagefolder", data)
    bad = data / "train" / "brick" / "broken.jpg"
    bad.write_bytes(RANDOM_BYTES)
    proc = subprocess.run([sys.executable, "-m", "crossdali", "train", "classification", "--framework", "pytorch",
                           "--data", str(data), "--skip-check", "--epochs", "1", "--arch", "small_cnn",
                           "--crop-size", "32", "-b", "32"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("crossdali train classification --framework pytorch: error: ") and str(bad) in lines[-1]
    search = [line for line in lines if "without naming it" in line]
    assert search and f"in {data / 'train'} without naming it" in search[0], search
    files_named = set(re.findall(re.escape(str(data)) + r"/\S+\.jpg", proc.stderr))
    assert files_named == {str(bad)}, files_named  # no line names a good file
    assert not (tmp_path / "runs").exists(), list((tmp_path / "runs").rglob("*"))


def _env_without(module: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a Python that cannot import ``module``, as if it were not installed (a
    ``sitecustomize`` that blocks it, first on PYTHONPATH, so worker processes inherit it too)."""
    absent = tmp_path / "absent"
    absent.mkdir()
    (absent / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(absent), os.environ.get("PYTHONPATH")])),
                **extra)


@pytest.mark.slow
def test_a_missing_dependency_is_one_line_naming_the_package(tiny_classification, tmp_path):
    """An incomplete install (here simplejpeg, which the check's fast pass imports in its worker processes) stops
    with one line naming the package and the install command, not a traceback from inside the process pool."""
    pytest.importorskip("torch")
    # an empty cache: the check runs and imports simplejpeg
    env = _env_without("simplejpeg", tmp_path, CROSSDALI_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "crossdali", "train", "classification", "--framework", "pytorch", "--data",
           str(tiny_classification / "imagefolder"), "--data-backend", "dali-cpu", "--epochs", "1", "--arch",
           "small_cnn", "--crop-size", "32", "-b", "32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("crossdali train classification --framework pytorch: error: the Python package simplejpeg is not "
                    "installed here, and crossdali needs it (`pip install simplejpeg`; `pip install -r "
                    "requirements/pytorch.txt -e .` from the source checkout installs every dependency)"), last
    assert not (tmp_path / "runs").exists()
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert debug.returncode == 1 and "ModuleNotFoundError" in debug.stderr  # --debug keeps the traceback


def test_a_missing_dependency_outside_a_script_is_one_line_too(tmp_path):
    """`crossdali plot` draws with matplotlib outside any training script's runner: the command's entry point gives
    crossdali's own message for it as one line too."""
    env = _env_without("matplotlib", tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"event": "start"}\n{"event": "epoch", "epoch": 1, "train_loss": 1.0}\n')
    proc = subprocess.run([sys.executable, "-m", "crossdali", "plot", str(run)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "crossdali: error: plotting a run needs matplotlib: pip install matplotlib", proc.stderr
