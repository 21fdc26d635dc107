"""horovodrun --gloo -np 2 with the Keras training script: gradients averaged, weights in sync,
val exactly once across ranks. Needs Horovod built for TensorFlow (docs/tensorflow.md says how;
not in the CI environment), skipped with the reason elsewhere."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.scripts.metrics import read_metrics

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]


def _horovod_tf() -> bool:
    if importlib.util.find_spec("horovod") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import horovod.tensorflow"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _horovod_tf(), reason="horovod.tensorflow is not importable (Horovod must be built against "
                                              "this TensorFlow; see docs/tensorflow.md)")
def test_horovodrun_two_ranks(data_root, tiny_classification, tmp_path):
    horovodrun = shutil.which("horovodrun") or str(Path(sys.executable).parent / "horovodrun")
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, "-m",
           "crossdali.tensorflow.train_classification", "--sample-size", "tiny", "--arch", "small_cnn",
           "--crop-size", "48", "-b", "16", "--epochs", "2", "--lr", "0.4", "--lr-warmup-epochs", "1", "-j", "1",
           "--print-freq", "0", "--output-dir", str(tmp_path)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    records = read_metrics(tmp_path)
    start = next(r for r in records if r["event"] == "start")
    assert start["engine"] == "horovod" and start["world_size"] == 2
    for r in (r for r in records if r["event"] == "epoch"):
        assert r["val_samples"] == 55 and r["train_samples"] == 256
    assert next(r for r in records if r["event"] == "end")["replicas_in_sync"] is True
