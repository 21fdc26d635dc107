"""SSD300 training (CPU): the loss falls on real DALI batches; the train script runs end to end,
evaluates COCO mAP, writes metrics and resumes; the mAP code scores perfect detections as 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.scripts.metrics import read_metrics

torch = pytest.importorskip("torch")
pytest.importorskip("pycocotools")

ROOT = Path(__file__).resolve().parents[2]
TRAIN = [sys.executable, "-m", "crossdali.detection_ssd.train", "--arch", "resnet18", "-b", "8", "--lr", "0.02",
         "--lr-warmup-epochs", "0.5", "-j", "2", "--print-freq", "1"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "2"}


@pytest.mark.slow
def test_loss_falls_on_dali_batches(mini_detection):
    """Eight SGD steps on one DALI batch of 4 (ResNet-18 SSD300, random init): the loss must at
    least halve. (The full CPU run below is too short to move mAP; see the GPU test for that.)"""
    from crossdali.detection_ssd import SSD300, MultiBoxLoss
    from crossdali.pytorch.detection import create_detection_loader

    torch.manual_seed(0)
    images, offsets, labels = next(iter(create_detection_loader(mini_detection, train=True, batch_size=4, workers=2)))
    model, criterion = SSD300(5, arch="resnet18"), MultiBoxLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(8):
        loss = criterion(*model(images), offsets, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_coco_map_of_ground_truth_is_one(detection_root):
    """The evaluation path (val loader -> records -> pycocotools) gives mAP 1 for the true boxes."""
    from crossdali.detection_ssd.coco_eval import coco_map, to_coco_results
    from crossdali.pytorch.detection import create_detection_loader

    loader = create_detection_loader(detection_root, train=False, batch_size=8, workers=1)
    records, ids = [], []
    for _, boxes, labels, image_ids in loader:
        dets = [(b[lab > 0], torch.ones(int((lab > 0).sum())), lab[lab > 0]) for b, lab in zip(boxes, labels)]
        records += to_coco_results(loader.source, image_ids.tolist(), dets)
        ids += image_ids.tolist()
    stats = coco_map(loader.source, records, ids)
    assert stats["map"] > 0.99 and stats["map50"] > 0.99
    # and shifted boxes score lower: the metric is not blind
    for r in records:
        r["bbox"][0] += 0.4 * r["bbox"][2]
    assert coco_map(loader.source, records, ids)["map"] < 0.5


@pytest.mark.slow
def test_train_script_evaluates_and_resumes(tmp_path, mini_detection):
    out = tmp_path / "run"
    proc = subprocess.run([*TRAIN, "--data", str(mini_detection), "--epochs", "1", "--output-dir", str(out)],
                          env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "val mAP" in proc.stderr and "img/s" in proc.stderr
    records = read_metrics(out)
    start = records[0]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert start["event"] == "start" and start["backend"] == "dali-cpu"
    assert [e["epoch"] for e in epochs] == [1]
    for e in epochs:
        assert e["train_samples"] == 16 and e["val_images"] == 8
        assert 0.0 <= e["val_map"] <= e["val_map50"] <= 1.0 and e["train_img_s"] > 0
    assert [r["step"] for r in records if r["event"] == "step"] == [1, 2]
    ckpt = torch.load(out / "checkpoint_last.pth", weights_only=True)
    assert ckpt["task"] == "detection" and len(ckpt["class_names"]) == ckpt["num_classes"]
    proc = subprocess.run([*TRAIN, "--data", str(mini_detection), "--epochs", "2", "--resume",
                           str(out / "checkpoint_last.pth")], env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stderr and "at epoch 2, step 0" in proc.stderr
    assert [r["epoch"] for r in read_metrics(out) if r["event"] == "epoch"] == [1, 2]
    assert (out / "curves.png").is_file()


@pytest.mark.slow
def test_synthetic_backend_trains_without_evaluation(tmp_path, mini_detection):
    out = tmp_path / "synthetic"
    proc = subprocess.run([*TRAIN, "--data", str(mini_detection), "--data-backend", "synthetic", "--epochs", "1",
                           "--output-dir", str(out)], env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "synthetic data: no COCO evaluation" in proc.stderr
    records = read_metrics(out)
    epoch, = [r for r in records if r["event"] == "epoch"]
    assert epoch["train_samples"] == 16 and "val_map" not in epoch  # 2 batches of 8, as the real split gives
    assert records[0]["backend"] == "synthetic" and (out / "checkpoint_last.pth").is_file()


def test_bad_data_folder_is_named(tmp_path):
    proc = subprocess.run([*TRAIN, "--data", str(tmp_path), "--epochs", "1"], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr  # a user error: one line
    assert f"no COCO annotation file for split 'train' under {tmp_path}" in proc.stderr


@pytest.mark.slow
def test_training_under_torchrun(tmp_path, mini_detection):
    """Two DDP ranks (gloo): disjoint train shards, val detections gathered from both ranks."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "-m", "crossdali.detection_ssd.train", *TRAIN[3:], "-b", "4", "-j", "1", "--data", str(mini_detection),
           "--epochs", "1", "--output-dir", str(out)]
    proc = subprocess.run(cmd, env={**_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out)
    (start,), (epoch,) = ([r for r in records if r["event"] == e] for e in ("start", "epoch"))  # rank 0 alone writes
    assert start["world_size"] == 2 and start["engine"] == "ddp"
    assert epoch["train_samples"] == 16  # 8 per rank, 2 full batches of 4 each
    assert epoch["val_images"] == 8  # every val image exactly once across the two ranks
