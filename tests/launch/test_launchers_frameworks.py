"""The TensorFlow and MXNet classification scripts under ``horovodrun --gloo -np 2`` (CPU).

They run where Horovod was built for that framework (``scripts/install-horovod --tensorflow`` or
``--mxnet`` in that framework's environment) and skip with the reason elsewhere: CI builds Horovod
only for PyTorch (``nox -s tests-pytorch``), because each build costs about 10 minutes on 2 cores.

Checked: both ranks train (world size 2, engine horovod), rank 0 alone writes, every val sample is
evaluated once across the ranks, and a single process evaluating the checkpoint rank 0 saved
reports the top-1 and loss the 2-rank job reported.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.scripts.metrics import read_metrics

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
HOROVODRUN = Path(sys.executable).parent / "horovodrun"
COMMON = ["-b", "16", "--epochs", "1", "-j", "1", "--print-freq", "0", "--lr-warmup-epochs", "0.5"]
FRAMEWORKS = {
    "tensorflow": {"module": "crossdali.tensorflow.train_classification", "needs": ["tensorflow", "nvidia.dali.plugin.tf"],
                   "args": ["--arch", "small_cnn", "--crop-size", "48", "--lr", "0.4"],
                   "checkpoint": lambda out: out},
    "mxnet": {"module": "crossdali.mxnet.train_classification", "needs": ["mxnet"],
              "args": ["--arch", "resnet18_v1", "--crop-size", "32", "--lr", "0.05"],
              "checkpoint": lambda out: out / "checkpoint.params"},
}


def _horovod_built_for(framework: str) -> bool:
    """Horovod's per-framework extension exists (the Python package is there even when it does not)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not HOROVODRUN.exists():
        return False
    package = Path(next(iter(spec.submodule_search_locations))) / framework
    return any(package.glob("mpi_lib*.so"))


def _run(command: list[str], data_root: Path) -> None:
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{command[:6]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_horovodrun_training_matches_single_process_evaluation(tmp_path, data_root, tiny_classification, framework):
    spec = FRAMEWORKS[framework]
    # a subprocess: under pytest, tests/tensorflow and tests/mxnet would pass for the real packages
    probe = subprocess.run([sys.executable, "-c", "import " + ", ".join(spec["needs"])], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"{', '.join(spec['needs'])} cannot be imported here: {probe.stderr.strip().splitlines()[-1]}")
    if not _horovod_built_for(framework):
        pytest.skip(f"Horovod is not built for {framework} here: scripts/install-horovod --{framework}")
    train = [sys.executable, "-m", spec["module"], "--data", str(tiny_classification / "imagefolder"),
             *spec["args"], *COMMON]
    out = tmp_path / "hvd"
    _run([str(HOROVODRUN), "--gloo", "-np", "2", "-H", "localhost:2", *train, "--output-dir", str(out)], data_root)
    records = read_metrics(out)  # rank 0 alone writes: one start record, one epoch record
    start, epoch = records[0], [r for r in records if r["event"] == "epoch"]
    assert start["world_size"] == 2 and start["engine"] == "horovod"
    assert len([r for r in records if r["event"] == "start"]) == 1 and len(epoch) == 1
    epoch = epoch[0]
    assert epoch["val_samples"] == 55
    assert epoch["train_samples"] == 2 * (132 // 16) * 16

    single = tmp_path / "single"
    _run([*train, "--resume", str(spec["checkpoint"](out)), "--test-only", "--output-dir", str(single)], data_root)
    start1, test = read_metrics(single)
    assert start1["world_size"] == 1 and test["val_samples"] == 55
    assert test["val_top1"] == pytest.approx(epoch["val_top1"])
    assert test["val_loss"] == pytest.approx(epoch["val_loss"], rel=1e-4)
