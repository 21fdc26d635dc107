"""The PyTorch training script end to end (CPU, DALI CPU pipeline), alone and under torchrun."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.data.sample_data import class_names
from crossdali.common.scripts.metrics import read_metrics

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# 11 classes: chance is 9.1 %. Three epochs of ResNet-18 at 64 px reached 70.9 % top-1 here.
TOP1_THRESHOLD = 40.0
TRAIN = [sys.executable, "-m", "crossdali.pytorch.train_classification", "--sample-size", "tiny", "--arch",
         "resnet18", "--crop-size", "64", "-b", "32", "--lr", "0.2", "--lr-warmup-epochs", "0.5", "-j", "2",
         "--print-freq", "0"]


def _env(data_root) -> dict[str, str]:
    return {**os.environ, "CROSSDALI_DATA": str(data_root), "OMP_NUM_THREADS": "2"}


def test_training_beats_chance_and_resumes(tmp_path, data_root, tiny_classification):
    # no --output-dir: the run goes to runs/<task>-<framework>-<arch>-<time> under the working directory
    proc = subprocess.run([*TRAIN, "--epochs", "3"], env=_env(data_root), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data backend: dali-cpu" in proc.stderr  # says which pipeline it uses, in one line
    out, = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"classification-pytorch-resnet18-\d{8}-\d{6}", out.name), out.name
    assert f"outputs: runs/{out.name}" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint_best.pth", "checkpoint_last.pth", "curves.png",
                                                     "metrics.jsonl"]
    records = read_metrics(out)
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert all(r["val_samples"] == 55 and r["train_samples"] == 264 for r in epochs)
    assert epochs[-1]["val_top1"] >= TOP1_THRESHOLD, epochs
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert all(r["train_img_s"] > 0 and r["data_wait_s"] >= 0 for r in epochs)
    steps = [r for r in records if r["event"] == "step"]  # one record per optimizer step, with its data wait
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, s) for e in (1, 2, 3) for s in range(1, 10)]
    assert all(r["data_wait_s"] >= 0 and r["step_s"] > 0 and r["samples"] in (32, 8) for r in steps)
    summary, = [r for r in records if r["event"] == "summary"]
    best = max(epochs, key=lambda r: r["val_top1"])
    assert (summary["best"], summary["best_epoch"], summary["epochs"]) == (best["val_top1"], best["epoch"], 3)
    assert "best val_top1" in proc.stderr and f"outputs in runs/{out.name}" in proc.stderr

    # the checkpoints carry the class names and the whole configuration
    ckpt = torch.load(out / "checkpoint_last.pth", weights_only=True)
    assert ckpt["class_names"] == class_names() and ckpt["num_classes"] == 11
    assert ckpt["config"]["arch"] == "resnet18" and ckpt["config"]["crop_size"] == 64
    assert torch.load(out / "checkpoint_best.pth", weights_only=True)["best_epoch"] == best["epoch"]

    # evaluating the saved checkpoint reproduces the last epoch's top-1 exactly
    proc = subprocess.run([*TRAIN, "--resume", str(out / "checkpoint_last.pth"), "--test-only", "--output-dir",
                           str(tmp_path / "test")], env=_env(data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    test = [r for r in read_metrics(tmp_path / "test") if r["event"] == "test"][-1]
    assert test["val_top1"] == pytest.approx(epochs[-1]["val_top1"]) and test["val_samples"] == 55

    # resuming continues at the next epoch, in the checkpoint's folder
    proc = subprocess.run([*TRAIN, "--epochs", "4", "--resume", str(out / "checkpoint_last.pth")],
                          env=_env(data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["epoch"] for r in read_metrics(out) if r["event"] == "epoch"] == [1, 2, 3, 4]


def test_bad_resume_path_is_one_line(tmp_path, data_root, tiny_classification):
    proc = subprocess.run([*TRAIN, "--epochs", "1", "--resume", str(tmp_path / "missing.pth")], env=_env(data_root),
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(f"error: --resume {tmp_path / 'missing.pth'} does not exist")
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()  # nothing written for a failed start


def test_pipelines_flag_reads_every_image_once_and_resumes_only_with_its_count(tmp_path, data_root,
                                                                              tiny_classification):
    """--pipelines 2: the shard split over two DALI pipelines (every image once per epoch, the run's
    start record says 2); a checkpoint holds both pipelines' DALI positions, so resuming it without
    --pipelines 2 is refused in one line that names the flag, and with it training goes on."""
    out = tmp_path / "run"
    proc = subprocess.run([*TRAIN, "--epochs", "1", "--pipelines", "2", "--output-dir", str(out)],
                          env=_env(data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out)
    start, = [r for r in records if r["event"] == "start"]
    epoch, = [r for r in records if r["event"] == "epoch"]
    assert start["pipelines"] == 2 and (epoch["train_samples"], epoch["val_samples"]) == (264, 55), (start, epoch)
    # 264 images, batch 32 split 16 + 16: 8 full steps and one of 8
    assert [r["samples"] for r in records if r["event"] == "step"] == [32] * 8 + [8]

    resume = [*TRAIN, "--epochs", "2", "--resume", str(out / "checkpoint_last.pth")]
    proc = subprocess.run(resume, env=_env(data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "2 DALI pipeline(s)" in last and "--pipelines 2" in last and "Traceback" not in proc.stderr, last
    proc = subprocess.run([*resume, "--pipelines", "2"], env=_env(data_root), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    epochs = [r for r in read_metrics(out) if r["event"] == "epoch"]
    assert [(r["epoch"], r["train_samples"]) for r in epochs] == [(1, 264), (2, 264)]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517", *args]


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_torchrun_ranks_see_disjoint_shards(tmp_path, data_root, indexed_val_source, assert_epoch_coverage, backend):
    data = tmp_path / "data"
    data.mkdir()
    (data / "val.txt").write_text("\n".join(f"{f} {i}" for i, f in enumerate(indexed_val_source.files)) + "\n")
    proc = subprocess.run(_torchrun(str(Path(__file__).with_name("shard_probe.py")), str(data), str(tmp_path), backend),
                          env=_env(data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["dist"] for r in ranks] == [[0, 2, 0, "torchrun"], [1, 2, 1, "torchrun"]]
    assert_epoch_coverage([r["seen"] for r in ranks], indexed_val_source.num_samples)


def test_training_under_torchrun(tmp_path, data_root, tiny_classification):
    out = tmp_path / "ddp"
    proc = subprocess.run(_torchrun("-m", "crossdali.pytorch.train_classification", *TRAIN[3:], "--epochs", "1",
                                    "--output-dir", str(out)),
                          env=_env(data_root), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out)
    (start,), (epoch,) = ([r for r in records if r["event"] == e] for e in ("start", "epoch"))  # rank 0 alone writes
    assert start["world_size"] == 2 and start["engine"] == "ddp"
    assert epoch["val_samples"] == 55  # every val sample exactly once across the two ranks
    # DROP under 2 ranks: 264 samples, 132 per rank, 4 full batches of 32 each
    assert epoch["train_samples"] == 2 * 4 * 32
