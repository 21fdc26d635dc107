"""A job checkpointed mid-epoch on N ranks resumes on M ranks in the global order
(``crossdali.common.loading.global_order``): the union of the samples the two jobs read in that epoch is
every sample exactly once, and the order is the one permutation of (seed, epoch) whatever the ranks.

Ranks are simulated as N real DALI loaders (the PyTorch loader, DALI CPU pipeline, real JPEGs of the tiny
set) with shard ids in one process, checkpointed with their ``state_dict()``s as the training script's
checkpoint holds them; one test runs the real training script: one process stopped mid-epoch, resumed by
torchrun with two. Labels are sample indices, so a batch's labels say which samples it held.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nvidia.dali")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import UsageError  # noqa: E402
from crossdali.common.loading.global_order import epoch_permutation, rank_positions, resume_point  # noqa: E402
from crossdali.pytorch.loaders import create_classification_loader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "pytorch" / "resume_probe.py"
SEED, BATCH = 5, 4


def _loaders(source, world: int, *, last_batch: str = "partial", seed: int = SEED, global_order: bool = True):
    return [create_classification_loader(source, train=True, backend="dali-cpu", batch_size=BATCH, crop_size=32,
                                         workers=1, seed=seed, dist=DistInfo(rank=r, world_size=world, local_rank=r),
                                         last_batch=last_batch, global_order=global_order) for r in range(world)]


def _steps(loaders, iters, count: int | None = None) -> list[list[list[int]]]:
    """``count`` steps (None: to the epoch's end) of every rank in lockstep: per step, each rank's labels."""
    steps = []
    while count is None or len(steps) < count:
        step = [next(it, None) for it in iters]
        if all(b is None for b in step):
            break
        steps.append([b[1].tolist() if b is not None else [] for b in step])
    return steps


def _flat(steps) -> list[int]:
    return [i for step in steps for rank in step for i in rank]


def test_rank_positions_cover_the_epoch_once_for_every_world_size():
    for n in (1, 7, 55, 64):
        for world in (1, 2, 3, 4):
            for start in (0, 5, n):
                got = Counter(p for r in range(world)
                              for p in rank_positions(n, start=start, rank=r, world=world, batch_size=4, drop_last=False))
                assert got == Counter(range(start, max(start, n))), (n, world, start)
                kept = sorted(p for r in range(world)
                              for p in rank_positions(n, start=start, rank=r, world=world, batch_size=4, drop_last=True))
                assert kept == list(range(start, start + len(kept)))  # a prefix: only the tail is left out
                assert 0 <= max(0, n - start) - len(kept) < world * 4
    assert list(epoch_permutation(10, seed=1, epoch=2)) == list(epoch_permutation(10, seed=1, epoch=2))
    assert list(epoch_permutation(10, seed=1, epoch=2)) != list(epoch_permutation(10, seed=1, epoch=3))


def test_global_batches_are_the_same_samples_on_one_rank_and_on_two(indexed_val_source):
    """One rank with batch 8 and two with batch 4 read the same samples at every step, in the permutation."""
    one = create_classification_loader(indexed_val_source, train=True, backend="dali-cpu", batch_size=2 * BATCH,
                                       crop_size=32, workers=1, seed=SEED, last_batch="partial", global_order=True)
    single = [sorted(b[1].tolist()) for b in one]
    two = _loaders(indexed_val_source, 2)
    double = [sorted(s[0] + s[1]) for s in _steps(two, [iter(x) for x in two])]
    assert single == double
    perm = epoch_permutation(55, seed=SEED, epoch=0).tolist()
    assert single == [sorted(perm[i:i + 8]) for i in range(0, 55, 8)]
    again = [sorted(b[1].tolist()) for b in one]  # epoch 2: another permutation, every sample once
    assert sorted(sum(again, [])) == list(range(55)) and again != single


@pytest.mark.parametrize(("saved", "resumed", "steps"), [(1, 2, 5), (2, 1, 3), (2, 4, 2), (4, 2, 2)])
def test_checkpoint_on_n_ranks_resumes_on_m_ranks_every_sample_once(indexed_val_source, saved, resumed, steps):
    """55 samples (odd: a short tail), batch 4: ``steps`` steps on ``saved`` ranks, checkpoint, the rest of the
    epoch and the next one on ``resumed`` ranks."""
    first = _loaders(indexed_val_source, saved)
    before = _steps(first, [iter(x) for x in first], steps)
    states = [x.state_dict() for x in first]
    states = json.loads(json.dumps(states))  # what a checkpoint file holds: plain values
    position = resume_point(states, num_samples=55)
    assert position == (0, saved * steps * BATCH)

    started = time.perf_counter()
    second = _loaders(indexed_val_source, resumed)
    done = [x.resume_from_ranks(states) for x in second]
    iters = [iter(x) for x in second]
    first_batch = [next(it) for it in iters]
    assert time.perf_counter() - started < 10  # the first batch after the restore: no replay of the epoch
    after = [[b[1].tolist() for b in first_batch], *_steps(second, iters)]

    read = _flat(before) + _flat(after)
    assert sorted(read) == list(range(55)), f"duplicated {[i for i, c in Counter(read).items() if c > 1]}"
    perm = epoch_permutation(55, seed=SEED, epoch=0).tolist()
    assert sorted(_flat(after)) == sorted(perm[position[1]:])  # the permutation's positions that were left
    assert [len(s[0]) for s in after[:-1]] == [BATCH] * (len(after) - 1)
    assert len(set(done)) == 1 and done[0] + len(after) == len(second[0])  # steps counted on the new scale

    nxt = _steps(second, [iter(x) for x in second])  # the next epoch, whole, on the new ranks
    assert sorted(_flat(nxt)) == list(range(55))
    perm1, step = epoch_permutation(55, seed=SEED, epoch=1).tolist(), resumed * BATCH
    assert [sorted(sum(s, [])) for s in nxt] == [sorted(perm1[i:i + step]) for i in range(0, 55, step)]


def test_drop_last_resume_reads_no_sample_twice(indexed_val_source):
    """Under ``drop`` (every rank whole batches) an epoch resumed on 4 ranks leaves out fewer than 4 batches'
    samples of what remained, the permutation's last ones, and repeats none."""
    first = _loaders(indexed_val_source, 2, last_batch="drop")
    assert len(first[0]) == 55 // 2 // BATCH
    before = _steps(first, [iter(x) for x in first], 2)
    states = [x.state_dict() for x in first]
    second = _loaders(indexed_val_source, 4, last_batch="drop")
    for x in second:
        x.resume_from_ranks(states)
    after = _steps(second, [iter(x) for x in second])
    assert all(len(rank) == BATCH for step in after for rank in step)
    read = _flat(before) + _flat(after)
    assert len(read) == len(set(read)) and 0 <= 55 - len(read) < 4 * BATCH
    perm = epoch_permutation(55, seed=SEED, epoch=0).tolist()
    assert sorted(read) == sorted(perm[:len(read)])  # what is left out is the end of the permutation


def test_same_number_of_ranks_resumes_bit_exact(indexed_val_source):
    """On the same number of ranks the DALI checkpoint is restored too: the same images, augmentation included."""
    ref = _loaders(indexed_val_source, 2)
    ref_batches = [[b for b in x] for x in ref]
    run = _loaders(indexed_val_source, 2)
    iters = [iter(x) for x in run]
    for it in iters:
        for _ in range(3):
            next(it)
    states = [x.state_dict() for x in run]
    resumed = _loaders(indexed_val_source, 2)
    for x, state in zip(resumed, states):
        x.load_state_dict(state)
    for x, expected in zip(resumed, ref_batches):
        got = list(x)
        assert len(got) == len(expected) - 3
        for (images, labels), (ref_images, ref_labels) in zip(got, expected[3:]):
            assert torch.equal(labels, ref_labels) and torch.equal(images, ref_images)


def test_mismatched_states_are_refused_with_the_fix(indexed_val_source):
    sharded = _loaders(indexed_val_source, 1, global_order=False)[0]
    ordered = _loaders(indexed_val_source, 1)[0]
    with pytest.raises(UsageError, match="resume without --global-order"):
        ordered.load_state_dict(sharded.state_dict())
    with pytest.raises(UsageError, match="resume with --global-order"):
        sharded.load_state_dict(ordered.state_dict())
    other_seed = _loaders(indexed_val_source, 2, seed=SEED + 1)
    with pytest.raises(UsageError, match="seed=6 and this loader has seed=5"):
        ordered.resume_from_ranks([x.state_dict() for x in other_seed])
    two = _loaders(indexed_val_source, 2)
    with pytest.raises(ValueError, match="all 2 ranks"):
        ordered.resume_from_ranks([two[0].state_dict()])
    with pytest.raises(UsageError, match="the 'native' backend"):
        create_classification_loader(indexed_val_source, train=True, backend="native", global_order=True)
    with pytest.raises(UsageError, match="drop --pipelines 2"):
        create_classification_loader(indexed_val_source, train=True, backend="dali-cpu", batch_size=4, crop_size=32,
                                     workers=1, pipelines=2, global_order=True)


# --- the training script: one process stopped mid-epoch, resumed by two under torchrun -------------------

TRAIN = ["--data-format", "filelist", "--arch", "resnet18", "--crop-size", "32", "-b", "8", "--epochs", "1",
         "--lr", "0.05", "--lr-warmup-epochs", "0", "-j", "1", "--print-freq", "0", "--seed", "7", "--global-order",
         "--skip-check"]


@pytest.fixture(scope="module")
def indexed_data(tmp_path_factory, tiny_classification) -> Path:
    """File lists whose labels are sample indices: 64 train images, 8 val images."""
    from crossdali.common.data.sources import scan_image_folder

    root = tmp_path_factory.mktemp("indexed")
    train = scan_image_folder(tiny_classification / "imagefolder" / "train").files[::4][:64]
    val = scan_image_folder(tiny_classification / "imagefolder" / "val").files[:8]
    (root / "train.txt").write_text("".join(f"{f} {i}\n" for i, f in enumerate(train)))
    (root / "val.txt").write_text("".join(f"{f} {i}\n" for i, f in enumerate(val)))
    return root


def _probe(log: Path, out: Path, data: Path, *extra: str, kill_at: int = 0, nproc: int = 1):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)] \
        if nproc > 1 else [sys.executable]
    cmd = [*launcher, str(PROBE), str(log), str(kill_at), "TERM", "0", "--", *TRAIN, "--data", str(data),
           "--output-dir", str(out), *extra]
    return subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)


def _labels(log: Path) -> list[list[int]]:
    return [json.loads(line)["labels"] for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.slow
def test_training_script_stopped_on_one_process_resumes_on_two(tmp_path, indexed_data):
    out = tmp_path / "run"
    stopped = _probe(tmp_path / "one.jsonl", out, indexed_data, kill_at=4)  # 4 of 8 steps: 32 samples read
    assert stopped.returncode == 128 + 15, stopped.stderr[-3000:]
    assert "stopped by SIGTERM at epoch 1, step 4" in stopped.stderr
    resumed = _probe(tmp_path / "two{rank}.jsonl", out, indexed_data, "--resume", str(out / "checkpoint_last.pth"),
                     nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "saved by 1 process(es), continued by 2" in resumed.stderr
    assert "epoch 1 continues at step 2 of 4" in resumed.stderr  # 32 of 64 samples: 2 of 4 steps of 2 x 8
    before = _labels(tmp_path / "one.jsonl")
    after = [_labels(tmp_path / f"two{r}.jsonl") for r in range(2)]
    assert [len(b) for b in before] == [8] * 4 and [len(a) for a in after] == [2, 2]
    read = [i for b in before for i in b] + [i for rank in after for b in rank for i in b]
    assert sorted(read) == list(range(64))  # every sample of the epoch exactly once
    # the schedule goes on at the same point of the epoch: cosine over 4 steps of the new global batch 16, whose
    # rate is --lr 0.05 scaled from a global batch of 256, at steps 2 and 3 (counted from 0)
    from crossdali.common.scripts.metrics import latest_records, read_metrics

    lrs = [r["lr"] for r in latest_records(read_metrics(out), "step") if r["step"] > 2]
    base = 0.05 * 16 / 256
    assert lrs == pytest.approx([base * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in (2, 3)])
