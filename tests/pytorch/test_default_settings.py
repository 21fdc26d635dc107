"""The PyTorch classification script with the settings left to the machine (no --amp, --channels-last,
-b, -j): on the CPU it trains with today's float32 settings, says so in its first settings line and
records them in its start record."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from crossdali.common.scripts.metrics import read_metrics

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow


def test_a_cpu_run_with_the_defaults_trains_and_records_them(tmp_path, data_root, tiny_classification):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "crossdali.pytorch.train_classification", "--sample-size", "tiny",
                           "--arch", "resnet18", "--crop-size", "32", "--epochs", "1", "--print-freq", "0",
                           "--output-dir", str(out)],
                          env={**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("run settings on the CPU: amp off (auto), memory format contiguous (auto), batch 128 per process (auto), "
            "lr 0.05 = 0.1 x 128/256, -j 4 (auto)") in proc.stderr
    records = read_metrics(out)
    start, = [r for r in records if r["event"] == "start"]
    assert (start["amp"], start["memory_format"], start["batch_size"], start["workers"], start["cuda"]) == \
        (False, "contiguous", 128, 4, False)
    assert (start["lr"], start["lr_rule"]) == (0.05, "0.1 x 128/256")
    assert start["auto_defaults"] == ["amp", "channels_last", "batch_size", "workers"]
    epoch, = [r for r in records if r["event"] == "epoch"]
    assert epoch["train_samples"] == 264 and epoch["val_samples"] == 55  # 128 + 128 + 8: every image once
    ckpt = torch.load(out / "checkpoint_last.pth", weights_only=True)
    assert (ckpt["config"]["batch_size"], ckpt["config"]["amp"], ckpt["config"]["workers"]) == (128, False, 4)
