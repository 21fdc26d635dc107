"""A training run killed mid-epoch and resumed sees exactly what an uninterrupted run sees: the same
samples in the same order with the same augmentation (the labels are sample indices, and the loss of
every step is compared bit for bit), and ends with the same epoch metrics.

Killed by SIGTERM (the script finishes the step, saves and exits 143), by SIGKILL after a
``--checkpoint-every`` checkpoint (the steps after it are redone), and under torchrun with only
one rank signalled (both ranks must stop after the same step, the one after the signal's). CPU,
DALI CPU pipeline, ResNet-18 at 32 px on 64 train / 16 val samples of the tiny set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crossdali.common.scripts.metrics import latest_records, read_metrics

pytest.importorskip("torch")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("resume_probe.py")
# 64 train samples, batch 8: 8 steps per epoch in one process, 4 per rank under 2 ranks (DROP)
TRAIN = ["--data-format", "filelist", "--arch", "resnet18", "--crop-size", "32", "-b", "8", "--epochs", "2",
         "--lr", "0.05", "--lr-warmup-epochs", "0.5", "-j", "2", "--print-freq", "0", "--seed", "7"]


@pytest.fixture(scope="module")
def indexed_data(tmp_path_factory, tiny_classification) -> Path:
    """File lists whose labels are the sample indices: 64 train images (every 4th of the tiny set's
    train split, so all classes appear) and 16 val images."""
    from crossdali.common.data.sources import scan_image_folder

    root = tmp_path_factory.mktemp("indexed")
    train = scan_image_folder(tiny_classification / "imagefolder" / "train").files[::4][:64]
    val = scan_image_folder(tiny_classification / "imagefolder" / "val").files[:16]
    (root / "train.txt").write_text("".join(f"{f} {i}\n" for i, f in enumerate(train)))
    (root / "val.txt").write_text("".join(f"{f} {i}\n" for i, f in enumerate(val)))
    return root


def _probe(log: Path, out: Path, data: Path, *extra: str, kill_at: int = 0, signal: str = "TERM", kill_rank: int = 0,
           torchrun: bool = False) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"] if torchrun \
        else [sys.executable]
    cmd = [*launcher, str(PROBE), str(log), str(kill_at), signal, str(kill_rank), "--", *TRAIN, "--data", str(data),
           "--output-dir", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1" if torchrun else "2"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _steps(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _epoch_metrics(out: Path) -> list[tuple]:
    keys = ("epoch", "train_loss", "train_samples", "val_loss", "val_top1", "val_samples")
    return [tuple(r[k] for k in keys) for r in latest_records(read_metrics(out), "epoch")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, indexed_data) -> tuple[list[dict], list[tuple]]:
    """The uninterrupted run: every step's labels and loss, and the epoch metrics."""
    tmp = tmp_path_factory.mktemp("reference")
    proc = _probe(tmp / "steps.jsonl", tmp / "run", indexed_data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = _steps(tmp / "steps.jsonl")
    assert len(steps) == 16 and all(len(s["labels"]) == 8 for s in steps)
    epoch1, epoch2 = (sorted(i for s in steps[e * 8:(e + 1) * 8] for i in s["labels"]) for e in (0, 1))
    assert epoch1 == epoch2 == list(range(64))  # every sample once per epoch
    assert [s["labels"] for s in steps[:8]] != [s["labels"] for s in steps[8:]]  # reshuffled every epoch
    return steps, _epoch_metrics(tmp / "run")


def test_sigterm_mid_epoch_then_resume_is_bit_exact(tmp_path, indexed_data, reference):
    ref_steps, ref_epochs = reference
    out = tmp_path / "run"
    killed = _probe(tmp_path / "killed.jsonl", out, indexed_data, kill_at=11)  # epoch 2, step 3, mid-step
    assert killed.returncode == 128 + 15, killed.stderr[-3000:]
    assert "SIGTERM received: finishing this step" in killed.stderr
    last = killed.stderr.strip().splitlines()[-1]
    assert f"stopped by SIGTERM at epoch 2, step 3; checkpoint {out / 'checkpoint_last.pth'}" in last
    assert "Traceback" not in killed.stderr

    resumed = _probe(tmp_path / "resumed.jsonl", out, indexed_data, "--resume", str(out / "checkpoint_last.pth"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "at epoch 2, step 3" in resumed.stderr
    steps = _steps(tmp_path / "killed.jsonl") + _steps(tmp_path / "resumed.jsonl")
    assert [s["labels"] for s in steps] == [s["labels"] for s in ref_steps]
    assert [s["loss"] for s in steps] == [s["loss"] for s in ref_steps]  # bit for bit
    assert _epoch_metrics(out) == ref_epochs
    # the per-step records (loss, lr) of the two parts are the uninterrupted run's too
    step_losses = [r["loss"] for r in latest_records(read_metrics(out), "step")]
    assert step_losses == [s["loss"] for s in ref_steps]


def test_sigkill_after_periodic_checkpoint_then_resume_is_bit_exact(tmp_path, indexed_data, reference):
    ref_steps, ref_epochs = reference
    out = tmp_path / "run"
    killed = _probe(tmp_path / "killed.jsonl", out, indexed_data, "--checkpoint-every", "5", kill_at=13, signal="KILL")
    assert killed.returncode == -9, killed.stderr[-3000:]  # no chance to save: the last checkpoint is step 10
    resumed = _probe(tmp_path / "resumed.jsonl", out, indexed_data, "--resume", str(out / "checkpoint_last.pth"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at epoch 2, step 2" in resumed.stderr  # global step 10 = epoch 2, step 2
    steps = _steps(tmp_path / "killed.jsonl")[:10] + _steps(tmp_path / "resumed.jsonl")
    assert [s["labels"] for s in steps] == [s["labels"] for s in ref_steps]
    assert [s["loss"] for s in steps] == [s["loss"] for s in ref_steps]
    assert _epoch_metrics(out) == ref_epochs


def test_torchrun_ranks_agree_to_stop_and_resume_bit_exact(tmp_path, indexed_data):
    """Only rank 1 gets SIGTERM, in step 6; both ranks must stop after the same step (step 7: the ranks
    agree one step late, so the host never waits for the GPU), and the resumed ranks must continue their
    own shards (each rank's DALI state is in the checkpoint)."""
    ref = _probe(tmp_path / "ref{rank}.jsonl", tmp_path / "ref", indexed_data, torchrun=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = tmp_path / "run"
    killed = _probe(tmp_path / "killed{rank}.jsonl", out, indexed_data, kill_at=6, kill_rank=1, torchrun=True)
    assert killed.returncode != 0
    assert "stopped by SIGTERM at epoch 2, step 3" in killed.stderr, killed.stderr[-3000:]
    assert [len(_steps(tmp_path / f"killed{r}.jsonl")) for r in range(2)] == [7, 7]  # the same step on both ranks
    resumed = _probe(tmp_path / "resumed{rank}.jsonl", out, indexed_data, "--resume", str(out / "checkpoint_last.pth"),
                     torchrun=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for r in range(2):
        steps = _steps(tmp_path / f"killed{r}.jsonl") + _steps(tmp_path / f"resumed{r}.jsonl")
        ref_steps = _steps(tmp_path / f"ref{r}.jsonl")
        assert len(ref_steps) == 8
        assert [s["labels"] for s in steps] == [s["labels"] for s in ref_steps], f"rank {r}"
        assert [s["loss"] for s in steps] == [s["loss"] for s in ref_steps], f"rank {r}"
    assert _epoch_metrics(out) == _epoch_metrics(tmp_path / "ref")


@pytest.mark.gpu
def test_torchrun_ranks_agree_to_stop_over_nccl_on_two_gpus(tmp_path, indexed_data):
    """The same agreement over NCCL, one rank per GPU (DALI GPU pipelines, float16 autocast): the
    question a step asks is queued on the GPU and answered at the next step, so both ranks stop after
    step 7; the resumed ranks see their shards' samples in order, the losses equal to cuDNN's rounding."""
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs (one NCCL rank each)")
    gpu = ("--data-backend", "dali-gpu", "--amp", "--channels-last")
    ref = _probe(tmp_path / "ref{rank}.jsonl", tmp_path / "ref", indexed_data, *gpu, torchrun=True)
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = tmp_path / "run"
    killed = _probe(tmp_path / "killed{rank}.jsonl", out, indexed_data, *gpu, kill_at=6, kill_rank=1, torchrun=True)
    assert "stopped by SIGTERM at epoch 2, step 3" in killed.stderr, killed.stderr[-3000:]
    assert [len(_steps(tmp_path / f"killed{r}.jsonl")) for r in range(2)] == [7, 7]
    resumed = _probe(tmp_path / "resumed{rank}.jsonl", out, indexed_data, *gpu, "--resume",
                     str(out / "checkpoint_last.pth"), torchrun=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for r in range(2):
        steps = _steps(tmp_path / f"killed{r}.jsonl") + _steps(tmp_path / f"resumed{r}.jsonl")
        ref_steps = _steps(tmp_path / f"ref{r}.jsonl")
        assert [s["labels"] for s in steps] == [s["labels"] for s in ref_steps], f"rank {r}"
        assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in ref_steps], rel=1e-2), f"rank {r}"


@pytest.mark.gpu
def test_sigterm_resume_on_gpu_with_amp(tmp_path, indexed_data):
    """The same on a CUDA GPU (DALI GPU pipeline, float16 autocast + GradScaler): the resumed run
    sees the same samples in the same order; the losses agree to cuDNN's run-to-run rounding."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (DALI mixed decoder, float16 autocast)")
    gpu = ("--data-backend", "dali-gpu", "--amp", "--channels-last")
    ref = _probe(tmp_path / "ref.jsonl", tmp_path / "ref", indexed_data, *gpu)
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = tmp_path / "run"
    killed = _probe(tmp_path / "killed.jsonl", out, indexed_data, *gpu, kill_at=11)
    assert killed.returncode == 128 + 15, killed.stderr[-3000:]
    resumed = _probe(tmp_path / "resumed.jsonl", out, indexed_data, *gpu, "--resume", str(out / "checkpoint_last.pth"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = _steps(tmp_path / "killed.jsonl") + _steps(tmp_path / "resumed.jsonl")
    ref_steps = _steps(tmp_path / "ref.jsonl")
    assert [s["labels"] for s in steps] == [s["labels"] for s in ref_steps]
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in ref_steps], rel=1e-2)
    ckpt = torch.load(out / "checkpoint_last.pth", weights_only=True)
    assert ckpt["scaler"]["scale"] > 1  # float16: the loss was scaled
