"""``benchmarks/tf_vs_torch.py --smoke``: the script behind the TF vs PyTorch dali-gpu numbers runs
its real rows on the CPU (dali-cpu, tiny set; TensorFlow alone where torch is not installed) and
writes a JSON with a positive rate and the batches' device for every row."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_tf_vs_torch_smoke(tmp_path, data_root):
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}  # conftest put ROOT on PYTHONPATH
    # measured 32 s alone and 60 s inside pytest on the loaded 2-core CPU machine
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tf_vs_torch", "--smoke", "--out", str(tmp_path)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "tf_vs_torch.json").read_text())
    rows = {r["name"]: r for r in report["rows"]}
    assert set(rows) == {"tensorflow loader", "tensorflow loader.dataset", "tensorflow loader.epoch_dataset",
                         "tensorflow raw DALIDataset", "pytorch loader"}
    for name, row in rows.items():
        if name == "pytorch loader" and importlib.util.find_spec("torch") is None:
            assert "not installed" in row["skipped"]
            continue
        assert "error" not in row, row
        assert row["epochs"] >= 2 and row["img_s"] > 0 and "CPU" in row["batch_device"].upper(), row
    # the loader's epochs are whole passes over the 264 tiny train images; the raw stream's include padding
    assert rows["tensorflow loader"]["images"] == 264 * rows["tensorflow loader"]["epochs"]
    assert rows["tensorflow loader.dataset"]["images"] == 264 * rows["tensorflow loader.dataset"]["epochs"]


def test_training_speed_smoke(tmp_path, data_root):
    """``benchmarks/training_speed.py --smoke``: the Keras training rows (synthetic, DALI, native) run the
    real script and their steady-state rates come from its step records."""
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}  # conftest put ROOT on PYTHONPATH
    # measured 15 s on an idle 2-core CPU machine
    proc = subprocess.run([sys.executable, "-m", "benchmarks.training_speed", "--smoke", "--framework", "tensorflow",
                           "--modes", "tuned", "--out", str(tmp_path)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "training_speed_tensorflow.json").read_text())
    rows = {r["backend"]: r for r in report["rows"]}
    assert list(rows) == ["synthetic", "dali-cpu", "native"], rows
    for backend, row in rows.items():
        assert "error" not in row, row
        # tiny set: 264 train images, batch 32 -> 9 steps per epoch, the last one partial (synthetic's
        # too: it yields the data loaders' batch sizes); epoch 2 is timed
        assert row["steps"] == 9 and row["images"] == 264 and row["img_s"] > 0, row
        assert 0 <= row["data_wait_share"] < 1 and f"--data-backend {backend}" in row["command"], row
        # the wait of every timed step, from the script's own step records
        assert len(row["data_wait_ms_per_step"]) == row["steps"], row
        assert row["data_wait_ms"]["max"] == pytest.approx(max(row["data_wait_ms_per_step"]), abs=1e-3), row
        # and every timed step's time, which add up to the row's seconds
        assert len(row["step_ms_per_step"]) == row["steps"], row
        assert sum(row["step_ms_per_step"]) / 1000 == pytest.approx(row["seconds"], rel=1e-3), row
        # steady state: without the epoch's first five steps and its last (steps 6-8 of 9, full batches of 32)
        mid = row["steady"]
        assert mid["steps"] == 3 and mid["img_s"] == pytest.approx(3 * 32 / (sum(row["step_ms_per_step"][5:8]) / 1000),
                                                                   rel=1e-3), row
    assert report["share_of_synthetic"]["synthetic"] == 1.0 and not report["amp"]
    assert report["share_of_synthetic_steady"]["synthetic"] == 1.0


def test_training_speed_variants(tmp_path, data_root):
    """``--variant``: every backend once per variant, the variant's flags passed to the script (its start
    record says what it ran with), each row's share over its own variant's synthetic row."""
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.training_speed", "--smoke", "--framework", "tensorflow",
                           "--backends", "synthetic,dali-cpu", "--modes", "tuned", "--variant", "graph=--jit-compile off",
                           "--variant", "xla=--jit-compile on", "--out", str(tmp_path)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "training_speed_tensorflow.json").read_text())
    assert report["variants"] == {"graph": "--jit-compile off", "xla": "--jit-compile on"}
    rows = {r["label"]: r for r in report["rows"]}
    assert list(rows) == ["synthetic [graph]", "dali-cpu [graph]", "synthetic [xla]", "dali-cpu [xla]"], rows
    for row in rows.values():
        assert "error" not in row and row["steps"] == 9, row
        assert row["jit_compile"] is (row["variant"] == "xla") and row["command"].endswith(report["variants"][row["variant"]])
    shares = report["share_of_synthetic"]
    assert shares["synthetic [graph]"] == shares["synthetic [xla]"] == 1.0
    for variant in ("graph", "xla"):
        assert shares[f"dali-cpu [{variant}]"] == pytest.approx(
            rows[f"dali-cpu [{variant}]"]["img_s"] / rows[f"synthetic [{variant}]"]["img_s"])


def test_training_speed_refuses_a_bad_variant(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.training_speed", "--framework", "tensorflow",
                           "--variant=--jit-compile on", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--variant '--jit-compile on': give NAME=FLAGS" in proc.stderr and "Traceback" not in proc.stderr
