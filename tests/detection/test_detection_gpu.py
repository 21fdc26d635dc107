"""GPU paths of the detection pipeline (mixed decoder, paste/slice/resize/encoder on the GPU) and a
GPU training run that must reach a stated mAP. Skipped where no CUDA GPU is visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crossdali.common.scripts.metrics import read_metrics

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (DALI mixed decoder)"),
]

ROOT = Path(__file__).resolve().parents[2]
# SSD300 / ResNet-18 from random weights, 60 epochs of the 256-image small sample set, batch 32.
# This run reaches mAP@0.5 of about 0.9 on a GPU; the threshold leaves
# room for seed-to-seed spread, not for a broken pipeline (random boxes score ~0).
MAP50_THRESHOLD = 0.75


@pytest.mark.parametrize("hw_decoder_load", [0.0, 1.0])
def test_gpu_train_geometry_matches_numpy(detection_root, expected_crop_boxes, hw_decoder_load):
    from crossdali.pytorch.detection import create_detection_loader

    loader = create_detection_loader(detection_root, train=True, backend="dali-gpu", batch_size=16, workers=2,
                                     hw_decoder_load=hw_decoder_load, debug=True)
    n_images = 0
    for batch in loader:
        b = dict(zip(loader.names, batch))
        assert b["images"].is_cuda and b["boxes"].is_cuda and b["labels"].is_cuda
        assert b["images"].shape[1:] == (3, 300, 300) and b["boxes"].shape[1:] == (8732, 4)
        for i in range(b["images"].shape[0]):
            raw_labels = b["raw_labels"][i].cpu().numpy()
            raw = b["raw_boxes"][i].cpu().numpy()[: int((raw_labels > 0).sum())]
            expected, _ = expected_crop_boxes(raw, float(b["ratio"][i]), float(b["paste_x"][i]), float(b["paste_y"][i]),
                                              b["crop_anchor"][i].cpu().numpy(), b["crop_shape"][i].cpu().numpy(),
                                              int(b["flip"][i]))
            n = int((b["crop_labels"][i] > 0).sum())
            np.testing.assert_allclose(b["crop_boxes"][i][:n].cpu().numpy(), expected, atol=2e-5)
        n_images += b["images"].shape[0]
    assert n_images == 96


def test_gpu_val_close_to_cpu_val(detection_root):
    from crossdali.pytorch.detection import create_detection_loader

    cpu = list(create_detection_loader(detection_root, train=False, backend="dali-cpu", batch_size=8, workers=2))
    gpu = list(create_detection_loader(detection_root, train=False, backend="dali-gpu", batch_size=8, workers=2))
    for c, g in zip(cpu, gpu):
        assert torch.equal(c[3], g[3].cpu()) and torch.equal(c[2], g[2].cpu())
        torch.testing.assert_close(c[1], g[1].cpu())
        assert float((c[0] - g[0].cpu()).abs().mean()) < 0.05  # different JPEG decoders


@pytest.mark.slow
def test_gpu_training_reaches_map(tmp_path):
    pytest.importorskip("pycocotools", reason="COCO mAP needs pycocotools==2.0.11 (stage its cp312 wheel)")
    data = Path(os.environ.get("CROSSDALI_DATA", tmp_path / "data"))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "crossdali.detection_ssd.train", "--sample-size", "small", "--arch", "resnet18",
           "-b", "32", "--epochs", "60", "--lr", "0.02", "--lr-warmup-epochs", "2", "--amp", "--eval-every", "20",
           "-j", "8", "--print-freq", "0", "--data-backend", "dali-gpu", "--output-dir", str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "CROSSDALI_DATA": str(data)},
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out)
    evals = [r for r in records if "val_map50" in r]
    print(json.dumps(evals, indent=1))
    first_loss = next(r["train_loss"] for r in records if r.get("event") == "epoch")
    assert evals[-1]["train_loss"] < 0.5 * first_loss
    assert evals[-1]["val_map50"] > MAP50_THRESHOLD, evals[-1]
