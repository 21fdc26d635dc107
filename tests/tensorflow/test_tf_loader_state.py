"""The loader contract in TensorFlow: ``len``, epochs counted however the caller iterates,
``state_dict``/``load_state_dict`` (epoch-level for DALI, because DALIDataset cannot restore DALI
checkpoints: measured here), and loader iteration equal to ``loader.dataset`` batch for batch."""

from __future__ import annotations

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.loading.loaders import Loader  # noqa: E402
from crossdali.tensorflow import create_classification_loader  # noqa: E402

pytestmark = pytest.mark.tensorflow
SMALL = dict(batch_size=8, crop_size=16, workers=1)


def _labels(batches) -> list[list[int]]:
    return [lab.numpy().tolist() for _, lab in batches]


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("backend", ["dali-cpu", "native", "synthetic"])
def test_every_backend_implements_the_contract(tiny_classification, backend, shards):
    """264 train samples in batches of 32: 9 batches on one shard; on two, DROP keeps 4 full
    batches of the 5 the DALI reader yields per shard (the fifth is read and dropped)."""
    loader = create_classification_loader(tiny_classification / "imagefolder", train=True, backend=backend,
                                          batch_size=32, crop_size=16, workers=1,
                                          dist=DistInfo(shards - 1, shards, 0, "test"))
    steps = 9 if shards == 1 else 4
    assert isinstance(loader, Loader) and loader.batch_size == 32 and loader.num_classes == 11
    assert loader.state_dict()["epoch"] == 0 and len(loader) == steps
    it = iter(loader)
    for _ in range(len(loader)):  # the train script's pattern: it never asks past the last batch
        next(it)
    assert loader.state_dict() == ({"epoch": 1} if backend == "synthetic" else {"epoch": 1, "batches": 0})
    assert len(loader) == steps


@pytest.mark.parametrize("train,shards", [(True, 1), (True, 2), (False, 3)], ids=["train", "train-2-shards", "val-3-shards"])
def test_loader_iteration_equals_its_dataset(indexed_val_source, train, shards):
    """The epoch bookkeeping in Python (loader iteration: no tf.data op touches the batches, so GPU
    batches stay where they are) and in tf.data (``loader.dataset``, for ``model.fit``) give the same
    bits: three epochs of train (PARTIAL on one shard, DROP on two), one epoch of val."""
    dist = DistInfo(shards - 1, shards, 0, "test")
    loader = create_classification_loader(indexed_val_source, train=train, dist=dist, **SMALL)
    epochs = 3 if train else 1
    from_loader = [b for _ in range(epochs) for b in loader]
    from_dataset = list(loader.dataset.take(len(from_loader))) if train else list(loader.dataset)
    assert len(from_loader) == len(from_dataset) > 0
    for (xa, ya), (xb, yb) in zip(from_loader, from_dataset):
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
        np.testing.assert_array_equal(xa.numpy(), xb.numpy())


def test_a_loop_left_mid_epoch_continues_that_epoch(indexed_val_source):
    loader = create_classification_loader(indexed_val_source, train=False, **SMALL)  # 55 samples: 7 batches
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    del it
    assert len(loader) == 4 and loader.state_dict() == {"epoch": 0, "batches": 3}
    rest = list(loader)
    assert sum(_labels(first + rest), []) == list(range(55))
    assert loader.state_dict() == {"epoch": 1, "batches": 0} and len(loader) == 7
    assert sum(_labels(loader), []) == list(range(55))  # the next epoch: every sample once again


def test_dali_state_is_epoch_level(indexed_val_source, assert_epoch_coverage, caplog):
    """A restored DALI loader counts on from its epoch and gives that epoch whole, in the order a
    fresh run gives (DALIDataset starts every new pipeline at epoch 0): every sample once."""
    fresh = create_classification_loader(indexed_val_source, train=True, **SMALL)
    first_epoch = _labels(fresh)
    restored = create_classification_loader(indexed_val_source, train=True, **SMALL)
    with caplog.at_level(logging.WARNING, logger="crossdali.tensorflow.loaders"):
        restored.load_state_dict({"epoch": 4, "batches": 2})
    assert "starts again from its first batch" in caplog.text
    assert restored.epoch == 4 and len(restored) == 7
    epoch = _labels(restored)
    assert epoch == first_epoch
    assert_epoch_coverage([sum(epoch, [])], 55)
    assert restored.state_dict() == {"epoch": 5, "batches": 0}


def test_dali_checkpoints_are_refused_with_the_reason(indexed_val_source):
    with pytest.raises(ValueError, match="DALIDataset cannot restore a DALI pipeline checkpoint"):
        create_classification_loader(indexed_val_source, train=True, checkpointing=True, **SMALL)
    loader = create_classification_loader(indexed_val_source, train=True, **SMALL)
    with pytest.raises(ValueError, match="holds a DALI checkpoint"):
        loader.load_state_dict({"epoch": 1, "dali": "{}"})


def test_dalidataset_does_not_restore_dali_checkpoints(tiny_classification):
    """The measurement behind epoch-level TF state (DALI 2.4): the same pipeline, restored from a
    checkpoint taken after 3 batches, continues with batch 3 when run in Python, but a DALIDataset
    over it starts at a fresh run's batch 0. Should a DALI release change this, this test fails and
    the TF loaders can carry DALI checkpoints like the PyTorch ones."""
    from crossdali.common.classification import ClassificationTransform, create_classification_pipeline
    from crossdali.common.data.sources import resolve_source
    from crossdali.common.options import PipelineOptions
    from crossdali.tensorflow.dali_loader import dali_dataset

    src = resolve_source(tiny_classification / "imagefolder", "train")
    transform = ClassificationTransform(crop_size=16, output_layout="HWC")

    def pipe(**kw):
        return create_classification_pipeline(src, train=True, transform=transform, options=PipelineOptions(
            batch_size=8, num_threads=1, seed=5, checkpointing=True, **kw))

    run = pipe()
    run.build()
    labels = [np.array(run.run()[1].as_tensor()).ravel() for _ in range(4)]
    stopped = pipe()
    stopped.build()
    for _ in range(3):
        stopped.run()
    cpt = stopped.checkpoint()
    in_python = pipe(checkpoint=cpt)
    in_python.build()
    np.testing.assert_array_equal(np.array(in_python.run()[1].as_tensor()).ravel(), labels[3])
    ds = dali_dataset(pipe(checkpoint=cpt), batch_size=8, output_shapes=((8, 16, 16, 3), (8, 1)),
                      output_dtypes=(tf.float32, tf.int64), device_id=None, check_outputs=False)
    _, first = next(iter(ds))
    assert not np.array_equal(labels[3], labels[0])  # the test can tell the two apart
    np.testing.assert_array_equal(first.numpy().ravel(), labels[0])


@pytest.mark.parametrize("fmt", ["filelist", "tfrecord"])
def test_native_resumes_the_same_order_mid_epoch(indexed_val_source, tiny_classification, fmt):
    """The native train order is a function of (seed, epoch): a loader restored 1 batch into epoch 1
    gives the rest of the epoch the uninterrupted one gave."""
    data = indexed_val_source if fmt == "filelist" else tiny_classification / "tfrecord"
    kw = dict(train=True, backend="native", seed=3, dist=DistInfo(0, 2, 0, "test"), **SMALL)
    run = create_classification_loader(data, **kw)
    epochs = [_labels(run) for _ in range(2)]
    assert epochs[0] != epochs[1]  # reshuffled every epoch
    restored = create_classification_loader(data, **kw)
    restored.load_state_dict({"epoch": 1, "batches": 1})
    assert len(restored) == len(epochs[1]) - 1
    assert _labels(restored) == epochs[1][1:]
    assert restored.state_dict() == {"epoch": 2, "batches": 0}


@pytest.fixture
def global_seed_zero():
    """TensorFlow's global seed set to 0, as the training scripts' default ``--seed 0`` sets it."""
    tf.random.set_seed(0)
    yield
    tf.random.set_seed(None)


def test_native_tfrecord_train_order_with_the_global_seed_zero(tiny_classification, global_seed_zero):
    """The TFRecord train order traces and runs with the global seed at 0 (a seeded ``Dataset.shuffle``
    did not: 'symbolic Tensor as a Python bool'); each epoch holds the shard's 264 records, in an
    order of its own that a fresh loader repeats."""
    data = tiny_classification / "tfrecord"

    def loader():
        return create_classification_loader(data, train=True, backend="native", seed=0, last_batch="partial", **SMALL)

    run = loader()
    orders = [sum(_labels(run), []) for _ in range(2)]
    assert len(orders[0]) == len(orders[1]) == 264 and sorted(orders[0]) == sorted(orders[1])
    assert orders[0] != orders[1]  # reshuffled every epoch
    assert sum(_labels(loader()), []) == orders[0]  # a function of (seed, epoch)
