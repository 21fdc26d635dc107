"""The ``dlpack`` hand-over (DALI's buffers shared with TensorFlow, no ``DALIDataset``) gives the batches the
``dataset`` hand-over gives: the same pixels and labels in the same order, the same epochs over shards."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.tensorflow import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.tensorflow


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_dlpack_hands_over_the_batches_dalidataset_does(tiny_classification, assert_handovers_agree, train):
    """Two epochs (train: the second reshuffled and re-augmented), the last batch short: every batch equal to
    the bit, and the dlpack batches are TensorFlow tensors that outlive the loader's later batches."""
    epochs = assert_handovers_agree(
        lambda handover: create_classification_loader(
            tiny_classification / "imagefolder", train=train, backend="dali-cpu", batch_size=16, crop_size=32,
            workers=2, seed=3, handover=handover, hold_batches=2),
        outputs=("images", "labels"))
    assert [len(e) for e in epochs] == [17 if train else 4] * 2
    assert all(images.dtype == np.float32 and labels.dtype == np.int64 for e in epochs for images, labels in e)
    if train:  # the second epoch is another draw, not the first one again
        assert not np.array_equal(epochs[0][0][0], epochs[1][0][0])


def test_dlpack_val_is_every_sample_once_over_shards(indexed_val_source, assert_epoch_coverage):
    """55 samples over 2 ranks, 3 epochs (DALI pads every shard and rotates them between epochs)."""
    seen: list[list[list[int]]] = [[], [], []]
    for rank in range(2):
        loader = create_classification_loader(indexed_val_source, train=False, backend="dali-cpu", batch_size=8,
                                              crop_size=16, workers=1, dist=DistInfo(rank, 2, rank, "test"),
                                              handover="dlpack")
        for epoch in range(3):
            seen[epoch].append([i for _, lab in loader for i in lab.numpy().tolist()])
    for epoch in seen:
        assert_epoch_coverage(epoch, indexed_val_source.num_samples)


def test_dlpack_loader_keeps_its_tf_data_views(indexed_val_source, assert_epoch_coverage):
    """``loader.dataset`` (for ``model.fit``) is DALIDataset whatever the hand-over: one val epoch, every sample."""
    loader = create_classification_loader(indexed_val_source, train=False, backend="dali-cpu", batch_size=8,
                                          crop_size=16, workers=1, handover="dlpack")
    assert_epoch_coverage([[i for _, lab in loader.dataset for i in lab.numpy().tolist()]],
                          indexed_val_source.num_samples)


def test_dlpack_loader_state_resumes_at_the_epoch(indexed_val_source):
    """Epoch-level state, as with DALIDataset: a restored loader starts its epoch in a fresh run's order."""
    common = dict(train=False, backend="dali-cpu", batch_size=8, crop_size=16, workers=1, handover="dlpack")
    loader = create_classification_loader(indexed_val_source, **common)
    first = [i for _, lab in loader for i in lab.numpy().tolist()]
    restored = create_classification_loader(indexed_val_source, **common)
    restored.load_state_dict(loader.state_dict())
    assert restored.epoch == 1
    assert sorted(i for _, lab in restored for i in lab.numpy().tolist()) == sorted(first) == list(range(55))


def test_bad_handover_arguments_are_clear_errors(tiny_classification):
    with pytest.raises(ValueError, match=r"handover must be one of auto, dataset, dlpack, got 'cuda'"):
        create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali-cpu",
                                     batch_size=8, crop_size=16, handover="cuda")
    with pytest.raises(ValueError, match=r"hold_batches must be at least 1, got 0"):
        create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali-cpu",
                                     batch_size=8, crop_size=16, handover="dlpack", hold_batches=0)


def test_closed_dlpack_loader_says_so(tiny_classification):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali-cpu",
                                          batch_size=8, crop_size=16, workers=1, handover="dlpack")
    next(iter(loader))
    loader.close()
    with pytest.raises(RuntimeError, match="this loader was closed"):
        next(iter(loader))


def test_auto_handover_shares_on_the_cpu(tiny_classification):
    """``auto`` on the CPU (and wherever TensorFlow numbers the GPU as CUDA does) is ``dlpack``; the other
    backends have no hand-over to choose."""
    common = dict(train=False, batch_size=8, crop_size=16, workers=1, handover="auto")
    assert create_classification_loader(tiny_classification / "imagefolder", backend="dali-cpu",
                                        **common).handover == "dlpack"
    assert not hasattr(create_classification_loader(tiny_classification / "imagefolder", backend="native", **common),
                       "handover")
