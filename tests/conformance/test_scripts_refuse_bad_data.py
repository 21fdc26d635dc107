"""Every framework's training script refuses a bad sample before training, with one line naming the
file (exit 2), and trains on the rest with `crossdali check`'s exclusion list (reliability issue:
"Training scripts refuse bad data before training ... identically in PyTorch, TensorFlow and MXNet").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: framework -> (module to import, script, a small model of that framework)
SCRIPTS = {
    "pytorch": ("torch", "crossdali.pytorch.train_classification", "resnet18"),
    "tensorflow": ("tensorflow", "crossdali.tensorflow.train_classification", "small_cnn"),
    "mxnet": ("mxnet", "crossdali.mxnet.train_classification", "mobilenet0.25"),
    "jax": ("jax", "crossdali.jax.train_classification", "small_cnn"),
}


@pytest.fixture(scope="module")
def data_with_a_truncated_jpeg(tiny_classification, tmp_path_factory) -> tuple[Path, Path]:
    """Two classes, 6 train and 3 val images each, one train JPEG cut in half (DALI's decoder fails on it)."""
    root = tmp_path_factory.mktemp("bad-data")
    photos = {cls: sorted((tiny_classification / "imagefolder" / "train" / cls).glob("*.jpg"))[:9]
              for cls in ("astronaut", "coffee")}
    for cls, files in photos.items():
        for split, part in (("train", files[:6]), ("val", files[6:])):
            (root / split / cls).mkdir(parents=True)
            for f in part:
                shutil.copy(f, root / split / cls / f.name)
    bad = root / "train" / "coffee" / "truncated.jpg"
    data = photos["coffee"][0].read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return root, bad


def _train(framework: str, data: Path, out: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    _, script, arch = SCRIPTS[framework]
    cmd = [sys.executable, "-m", script, "--data", str(data), "--data-backend", "dali-cpu", "--arch", arch,
           "--epochs", "1", "-b", "4", "--crop-size", "32", "-j", "1", "--lr", "0.01", "--output-dir", str(out),
           "--print-freq", "0", *extra]
    env = {**os.environ, "CROSSDALI_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    # 10-40 s here per run (framework import + 1 tiny epoch); 600 s is >10x the slowest
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("framework", SCRIPTS)
def test_script_refuses_the_bad_file_then_trains_with_the_exclusion_list(framework, data_with_a_truncated_jpeg,
                                                                         tmp_path):
    pytest.importorskip(SCRIPTS[framework][0])
    data, bad = data_with_a_truncated_jpeg
    refused = _train(framework, data, tmp_path / "run1", tmp_path / "cache")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    # ": error:" (the script's own line), not any "error": TensorFlow 2.21 prints an INFO line about
    # "round-off errors" at import on CPUs where oneDNN is on by default (AVX-512), which
    # TF_CPP_MIN_LOG_LEVEL cannot silence (it comes before absl's log set-up)
    lines = [line for line in refused.stderr.strip().splitlines() if ": error:" in line.lower()]
    assert len(lines) == 1 and str(bad) in lines[0], refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr

    check = subprocess.run([sys.executable, "-m", "crossdali", "check", str(data), "--output-dir", str(tmp_path / "check"),
                            "--no-progress"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "CROSSDALI_CACHE": str(tmp_path / "cache")})
    assert check.returncode == 1, check.stderr[-2000:]  # 1: some samples are bad
    exclude = tmp_path / "check" / "exclude.txt"
    assert bad.name in exclude.read_text()

    trained = _train(framework, data, tmp_path / "run2", tmp_path / "cache", "--exclude", str(exclude))
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    assert "excluded 1 of 13 samples" in trained.stdout + trained.stderr  # said, never silent


@pytest.mark.slow
@pytest.mark.parametrize("framework", SCRIPTS)
def test_script_asks_for_num_classes_where_the_records_do_not_say(framework, tiny_classification, tmp_path):
    """TFRecord files without label metadata: one line naming the data and ``--num-classes`` (exit 2),
    not a traceback; with the flag, the same data passes that check (here: the run trains)."""
    pytest.importorskip(SCRIPTS[framework][0])
    data = tiny_classification / "tfrecord"
    refused = _train(framework, data, tmp_path / "run1", tmp_path / "cache", "--skip-check")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    lines = [line for line in refused.stderr.strip().splitlines() if ": error:" in line.lower()]
    assert len(lines) == 1 and "--num-classes" in lines[0] and str(data) in lines[0], refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    trained = _train(framework, data, tmp_path / "run2", tmp_path / "cache", "--skip-check", "--num-classes", "11")
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
