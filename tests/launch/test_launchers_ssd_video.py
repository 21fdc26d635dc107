"""The SSD and video training scripts (PyTorch) under ``horovodrun --gloo -np 2`` (CPU): both ranks
train with Horovod, rank 0 alone writes, and every val image / clip is evaluated exactly once
across the ranks. Short runs on tiny sample sets (one epoch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.scripts.metrics import read_metrics

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.pytorch]
ROOT = Path(__file__).resolve().parents[2]
HOROVODRUN = Path(sys.executable).parent / "horovodrun"


def _horovodrun(*args: str, data_root: Path) -> None:
    if not HOROVODRUN.exists():
        if os.environ.get("CROSSDALI_REQUIRE_HOROVOD") == "1":
            pytest.fail("CROSSDALI_REQUIRE_HOROVOD=1 but Horovod is not installed: run scripts/install-horovod")
        pytest.skip("Horovod is not installed in this environment: scripts/install-horovod (a full nox -s tests-pytorch)")
    env = {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(HOROVODRUN), "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, *args],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"horovodrun failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _records(output_dir: Path) -> tuple[dict, list[dict]]:
    records = read_metrics(output_dir)
    starts = [r for r in records if r["event"] == "start"]
    assert len(starts) == 1, records  # rank 0 alone writes
    return starts[0], [r for r in records if r["event"] == "epoch"]


def test_ssd_under_horovodrun(tmp_path, data_root):
    pytest.importorskip("pycocotools")
    from crossdali.common.data.sample_data.detection import DetectionSampleConfig, build_detection

    # the detection tests' mini set: 16 train / 8 val images with large objects
    cfg = DetectionSampleConfig(train_images=16, val_images=8, min_side=128, max_side=160, max_objects=3,
                                min_object=0.3, max_object=0.6)
    data = build_detection(data_root / "ci-mini", cfg)
    out = tmp_path / "ssd"
    _horovodrun("-m", "crossdali.detection_ssd.train", "--arch", "resnet18", "-b", "4", "--lr", "0.02",
                "--lr-warmup-epochs", "0.5", "-j", "1", "--print-freq", "0", "--data", str(data), "--epochs", "1",
                "--output-dir", str(out), data_root=data_root)
    start, epochs = _records(out)
    assert start["world_size"] == 2 and start["engine"] == "horovod"
    assert len(epochs) == 1
    assert epochs[0]["train_samples"] == 16  # 8 per rank, 2 full batches of 4 each
    assert epochs[0]["val_images"] == 8  # every val image exactly once across the two ranks


def test_video_under_horovodrun(tmp_path, data_root):
    pytest.importorskip("av", reason="the video sample set is encoded with PyAV: pip install av")
    from crossdali.common.data.sample_data import BUILDERS

    data = BUILDERS["video"](data_root, "tiny")  # 80 train / 20 val clips
    out = tmp_path / "video"
    _horovodrun("-m", "crossdali.video.train", "--data", str(data), "--data-backend", "dali-cpu", "--epochs", "1",
                "-b", "8", "--clip-len", "8", "--frame-stride", "2", "--crop-size", "56", "-j", "1",
                "--output-dir", str(out), data_root=data_root)
    start, epochs = _records(out)
    assert start["world_size"] == 2  # (the video script's start record does not name the engine)
    assert len(epochs) == 1
    assert epochs[0]["val_samples"] == 40  # 20 val files x 2 clips, each once across the two ranks
