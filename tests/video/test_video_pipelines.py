"""Several DALI pipelines per shard (``pipelines=``), CPU mode on the real VP9 clips: every clip
still once per epoch, ``len()`` is the number of batches, ranks take equal steps under DROP, and a
mid-epoch ``state_dict`` resumes with the very batches of the uninterrupted run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest


def _loader(src, *, train: bool, pipelines: int, batch_size: int = 6, rank: int = 0, world: int = 1):
    from crossdali.common.distributed import DistInfo
    from crossdali.pytorch.video import create_video_loader

    return create_video_loader(src, train=train, batch_size=batch_size, sequence_length=8, stride=2, step=8,
                               crop_size=32, workers=1, dist=DistInfo(rank=rank, world_size=world),
                               with_frame_num=True, pipelines=pipelines)


@pytest.mark.parametrize(("pipelines", "world"), [(3, 1), (2, 2)])
def test_val_every_clip_once_with_several_pipelines(indexed_val_clips, assert_epoch_coverage, pipelines, world):
    src, ids = indexed_val_clips
    seen = []
    for rank in range(world):
        loader = _loader(src, train=False, pipelines=pipelines, rank=rank, world=world)
        assert loader.pipelines == pipelines and loader.num_samples == len(ids)
        sizes, shard = [], []
        for clips, labels, frame_num in loader:
            assert clips.shape[0] == labels.shape[0] == frame_num.shape[0]
            sizes.append(clips.shape[0])
            shard += [ids[(int(lbl), int(f))] for lbl, f in zip(labels, frame_num, strict=True)]
        assert len(sizes) == len(loader)  # len() is exact here: no shard ends with a padding-only batch
        assert all(n == 6 for n in sizes[:-1]) and 0 < sizes[-1] <= 6  # full batches, then the remainder
        seen.append(shard)
    assert_epoch_coverage(seen, len(ids))


def test_train_ranks_take_equal_full_steps_and_reshuffle(indexed_val_clips):
    """2 ranks x 2 pipelines, DROP: every rank the same number of full batches, no clip twice in an
    epoch, and the next epoch in another order."""
    src, ids = indexed_val_clips
    loaders = [_loader(src, train=True, pipelines=2, batch_size=4, rank=r, world=2) for r in range(2)]
    epochs = []
    for _ in range(2):
        seen = []
        for loader in loaders:
            batches = [[ids[(int(lbl), int(f))] for lbl, f in zip(labels, frame_num, strict=True)]
                       for _, labels, frame_num in loader]
            assert len(batches) == len(loader) > 0 and all(len(b) == 4 for b in batches)
            seen += [i for b in batches for i in b]
        assert len(seen) == len(set(seen))
        left_out = len(ids) - len(seen)
        assert 0 <= left_out < 2 * 4  # DROP leaves out less than world x batch clips
        epochs.append(seen)
    assert epochs[0] != epochs[1]


def test_mid_epoch_state_resumes_with_the_same_batches(indexed_val_clips):
    src, _ = indexed_val_clips
    whole = [(c.numpy(), lbl.numpy()) for c, lbl, _ in _loader(src, train=True, pipelines=2)]
    first = _loader(src, train=True, pipelines=2)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert isinstance(state["dali"], list) and len(state["dali"]) == 2  # one DALI checkpoint per pipeline
    resumed = _loader(src, train=True, pipelines=2)
    resumed.load_state_dict(state)
    rest = [(c.numpy(), lbl.numpy()) for c, lbl, _ in resumed]
    assert len(rest) == len(whole) - 3
    for (c0, l0), (c1, l1) in zip(whole[3:], rest, strict=True):
        np.testing.assert_array_equal(l0, l1)
        np.testing.assert_array_equal(c0, c1)  # same clips, same crops and flips


def test_a_checkpoint_of_the_other_reader_restarts_the_epoch(indexed_val_clips, caplog):
    """The state names the DALI reader its checkpoint is from; restored into a loader reading with
    the other one (dali-gpu H.264 train: legacy; dali-cpu: experimental), the epoch starts again in
    a fresh run's order, with a warning, instead of feeding DALI a checkpoint it cannot restore."""
    src, _ = indexed_val_clips
    whole = [lbl.numpy() for _, lbl, _ in _loader(src, train=True, pipelines=1)]
    first = _loader(src, train=True, pipelines=1)
    it = iter(first)
    next(it)
    state = first.state_dict()
    assert state["dali_reader"] == "experimental"  # the CPU's reader
    state["dali_reader"] = "legacy"  # as if saved by a dali-gpu run
    resumed = _loader(src, train=True, pipelines=1)
    with caplog.at_level("WARNING"):
        resumed.load_state_dict(state)
    assert "saved by DALI's legacy reader" in caplog.text and "starts again from its first batch" in caplog.text
    again = [lbl.numpy() for _, lbl, _ in resumed]
    assert len(again) == len(whole)
    for l0, l1 in zip(whole, again, strict=True):
        np.testing.assert_array_equal(l0, l1)


def test_mistakes_are_named(indexed_val_clips):
    from crossdali.common.errors import UsageError

    src, _ = indexed_val_clips
    with pytest.raises(UsageError, match=r"pipelines=4 \(--pipelines\) must be positive and divide the batch size 6"):
        _loader(src, train=False, pipelines=4)
    two = _loader(src, train=False, pipelines=2)
    one = _loader(src, train=False, pipelines=1)
    with pytest.raises(UsageError, match=r"checkpoints of 2 DALI pipeline\(s\).*pipelines=2 \(--pipelines 2\)"):
        one.load_state_dict(two.state_dict())


def test_training_script_refuses_a_batch_that_does_not_split(tiny_video, tmp_path):
    """The script's user mistake: one line naming both flags, exit 2, before any training."""
    proc = subprocess.run([sys.executable, "-m", "crossdali.video.train", "--data", str(tiny_video),
                           "--data-backend", "dali-cpu", "-b", "6", "--pipelines", "4", "--epochs", "1",
                           "--output-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "--pipelines" in last and "--batch-size" in last and "Traceback" not in proc.stderr
