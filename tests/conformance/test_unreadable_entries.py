"""Entries of an ImageFolder that cannot be read as files (a symbolic link loop, a link to nothing,
a class entry that loops) are named, never a traceback: a bad sample the check reports and the
exclusion list leaves out, or one structural error naming the path; the training scripts refuse
them in one line (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import DataError
from tests.conformance.corpus import image_folder


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CROSSDALI_CACHE", str(tmp_path / "cache"))


def _check(data: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crossdali", "check", str(data), "--output-dir", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


@pytest.mark.parametrize("link", ["loop", "dangling"])
def test_link_that_reaches_no_file_is_a_named_bad_sample(link, tiny_classification, tmp_path):
    photo = sorted((tiny_classification / "imagefolder" / "val" / "astronaut").glob("*.jpg"))[0]
    root = image_folder(tmp_path / "data", tiny_classification, "good.jpg", photo.read_bytes())
    bad = root / "val" / "b" / "link.jpg"
    bad.symlink_to("link.jpg" if link == "loop" else "gone.jpg")
    with pytest.raises(DataError, match="link.jpg") as refused:
        resolve_source(root, "val")
    assert "\n" not in str(refused.value)
    if link == "loop":
        assert "symbolic link that never reaches a file" in str(refused.value)
    check = _check(root, tmp_path / "check")
    assert check.returncode == 1, check.stderr[-3000:]  # 1: bad samples found, the report written
    assert "Traceback" not in check.stderr
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["num_errors"] == 1
    assert resolve_source(root, "val", exclude=tmp_path / "check" / "exclude.txt").num_samples == 7


def test_class_entry_that_loops_is_one_structural_error(tiny_classification, tmp_path):
    photo = sorted((tiny_classification / "imagefolder" / "val" / "astronaut").glob("*.jpg"))[0]
    root = image_folder(tmp_path / "data", tiny_classification, "good.jpg", photo.read_bytes())
    (root / "val" / "c").symlink_to("c")
    with pytest.raises(DataError, match=r"val/c cannot be followed \(Too many levels of symbolic links\)"):
        resolve_source(root, "val")
    check = _check(root, tmp_path / "check")
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr[-3000:]
    assert "val/c cannot be followed" in (tmp_path / "check" / "report.json").read_text()


@pytest.mark.slow
def test_training_refuses_a_link_loop_in_one_line(tiny_classification, tmp_path):
    pytest.importorskip("torch")
    photos = sorted((tiny_classification / "imagefolder" / "train" / "astronaut").glob("*.jpg"))[:4]
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
            for p in photos:
                (tmp_path / "data" / split / cls / p.name).write_bytes(p.read_bytes())
    (tmp_path / "data" / "train" / "b" / "loop.jpg").symlink_to("loop.jpg")
    run = subprocess.run([sys.executable, "-m", "crossdali.pytorch.train_classification", "--data", str(tmp_path / "data"),
                          "--data-backend", "dali-cpu", "--arch", "resnet18", "--epochs", "1", "-b", "4", "--crop-size",
                          "32", "-j", "1", "--output-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 2, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if ": error:" in line.lower()]
    assert len(lines) == 1 and "loop.jpg" in lines[0] and "Traceback" not in run.stderr, run.stderr[-3000:]
