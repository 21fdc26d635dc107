"""TensorFlow loaders: DALIDataset on /cpu:0, epochs exactly-once over shards, native baseline
within a measured tolerance of DALI, clear errors for bad input."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.classification import (  # noqa: E402
    IMAGENET_STD,
    ClassificationTransform,
    PipelineOptions,
    create_classification_pipeline,
)
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.common.errors import DataError  # noqa: E402
from crossdali.tensorflow import create_classification_dataset, create_classification_loader  # noqa: E402
from crossdali.tensorflow.dali_loader import dali_dataset  # noqa: E402

pytestmark = pytest.mark.tensorflow
CROP = 48


@pytest.mark.parametrize("backend", ["dali-cpu", "native", "synthetic"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_backends_yield_tf_batches_on_cpu(tiny_classification, backend, train):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=train, backend=backend,
                                          batch_size=16, crop_size=CROP, workers=2)
    batches = list(loader)
    assert len(batches) == len(loader) == (17 if train else 4)  # 264 / 16 and 55 / 16, rounded up
    for images, labels in batches:
        assert isinstance(images, tf.Tensor) and images.dtype == tf.float32
        assert tuple(images.shape[1:]) == (CROP, CROP, 3)  # HWC: Keras' channels_last
        assert "CPU" in images.device
        assert labels.dtype == tf.int64 and tuple(labels.shape) == (images.shape[0],)
        assert 0 <= int(tf.reduce_min(labels)) and int(tf.reduce_max(labels)) < 11
    # every sample once, in the same batch sizes for every backend (synthetic: the ceiling step for step)
    assert [int(lab.shape[0]) for _, lab in batches] == [16] * (16 if train else 3) + [8 if train else 7]
    if backend != "synthetic":
        # normalized pixels: roughly zero-mean, unit-scale, not a constant
        x = np.concatenate([b[0].numpy() for b in batches])
        assert -1.5 < x.mean() < 1.5 and 0.3 < x.std() < 2.0


def test_synthetic_dataset_repeats_the_epochs_batch_sizes(tiny_classification):
    """Keras' view of the synthetic loader: endless, each epoch in the data loaders' batch sizes."""
    loader = create_classification_loader(tiny_classification / "imagefolder", train=True, backend="synthetic",
                                          batch_size=16, crop_size=CROP)
    sizes = [int(x.shape[0]) for x, _ in loader.dataset.take(2 * loader.steps_per_epoch)]
    assert sizes == 2 * ([16] * 16 + [8])


def test_chw_layout_and_float16(tiny_classification):
    hwc = create_classification_loader(tiny_classification / "imagefolder", train=False, batch_size=8, crop_size=32,
                                       workers=2)
    chw = create_classification_loader(tiny_classification / "imagefolder", train=False, batch_size=8, crop_size=32,
                                       workers=2, layout="CHW", dtype="float16")
    (a, la), (b, lb) = next(iter(hwc)), next(iter(chw))
    assert tuple(b.shape) == (8, 3, 32, 32) and b.dtype == tf.float16
    np.testing.assert_array_equal(la.numpy(), lb.numpy())
    np.testing.assert_allclose(a.numpy().transpose(0, 3, 1, 2), b.numpy().astype(np.float32), atol=0.01)


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_reads_the_tfrecord_sample(tiny_classification, backend):
    loader = create_classification_loader(tiny_classification / "tfrecord", train=False, backend=backend,
                                          batch_size=16, crop_size=CROP, workers=2)
    labels = np.concatenate([lab.numpy() for _, lab in loader])
    assert labels.tolist() == list(resolve_source(tiny_classification / "imagefolder", "val").labels)


def test_dali_reads_webdataset_shards(tiny_classification):
    loader = create_classification_loader(tiny_classification / "webdataset", train=False, backend="dali-cpu",
                                          batch_size=16, crop_size=CROP, workers=2)
    labels = np.concatenate([lab.numpy() for _, lab in loader])
    assert labels.tolist() == list(resolve_source(tiny_classification / "imagefolder", "val").labels)


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_val_exactly_once_over_shards(indexed_val_source, assert_epoch_coverage, backend, shards):
    """55 samples whose label is their index: every epoch must show each index once over all ranks,
    although DALI pads every shard to 4 batches of 8 and rotates shards between epochs."""
    seen: list[list[list[int]]] = [[], [], []]
    for rank in range(shards):
        loader = create_classification_loader(indexed_val_source, train=False, backend=backend, batch_size=8,
                                              crop_size=16, workers=1, dist=DistInfo(rank, shards, rank, "test"))
        for epoch in range(3):
            seen[epoch].append([i for _, lab in loader for i in lab.numpy().tolist()])
    for epoch in seen:
        assert_epoch_coverage(epoch, indexed_val_source.num_samples)


def test_val_dataset_is_one_epoch_and_repeatable(indexed_val_source, assert_epoch_coverage):
    ds = create_classification_dataset(indexed_val_source, train=False, batch_size=8, crop_size=16, workers=1,
                                       dist=DistInfo(1, 2, 1, "test"))
    first = [i for _, lab in ds for i in lab.numpy().tolist()]
    second = [i for _, lab in ds for i in lab.numpy().tolist()]
    assert first == second == list(range(27, 55))  # rank 1 of 2: the second half, once


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_train_two_shards_drop_to_equal_steps(indexed_val_source, backend):
    """Several ranks: DROP. Each rank takes (55 // 2) // 8 = 3 full batches per epoch, the ranks
    are disjoint within an epoch, and the left-out samples change between epochs (DALI)."""
    per_epoch: list[list[int]] = [[], []]
    for rank in range(2):
        loader = create_classification_loader(indexed_val_source, train=True, backend=backend, batch_size=8,
                                              crop_size=16, workers=1, dist=DistInfo(rank, 2, rank, "test"))
        assert len(loader) == 3
        for epoch in range(2):
            batches = [lab.numpy().tolist() for _, lab in loader]
            assert [len(b) for b in batches] == [8, 8, 8]
            per_epoch[epoch] += sum(batches, [])
    for ids in per_epoch:
        assert len(ids) == len(set(ids)) == 48
    if backend == "dali-cpu":
        assert set(per_epoch[0]) != set(per_epoch[1])  # global reshuffle each epoch


def test_train_dataset_is_endless_and_keras_fits_it(tiny_classification):
    loader = create_classification_loader(tiny_classification / "imagefolder", train=True, batch_size=32,
                                          crop_size=32, workers=2)
    assert loader.dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    model = tf.keras.Sequential([tf.keras.Input((32, 32, 3)), tf.keras.layers.Conv2D(8, 3, strides=2),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(11)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(loader.dataset, steps_per_epoch=loader.steps_per_epoch, epochs=2, verbose=0, shuffle=False)
    assert loader.steps_per_epoch == 9 and len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))


def test_stream_dataset_is_full_batches_every_sample_once_per_pass(indexed_val_source):
    """The view ``model.fit`` gets for train on a GPU (here on the CPU, the same pipeline): no tf.data op
    after DALIDataset, every batch full, labels (N,), and the reader running on across passes without
    padding: 55 samples in batches of 8 -> each run of 55 consecutive samples is every sample once."""
    loader = create_classification_loader(indexed_val_source, train=True, batch_size=8, crop_size=16, workers=1)
    assert loader.dataset is loader.epoch_dataset  # on the CPU model.fit keeps the exact epochs
    it = iter(loader.stream_dataset)
    seen = []
    for _ in range(14):  # 112 samples: two passes and a bit
        images, labels = next(it)
        assert tuple(images.shape) == (8, 16, 16, 3) and tuple(labels.shape) == (8,)
        seen += labels.numpy().tolist()
    assert sorted(seen[:55]) == sorted(seen[55:110]) == list(range(55))
    assert seen[:55] != seen[55:110]  # reshuffled every pass


def test_stream_dataset_refuses_val(indexed_val_source):
    loader = create_classification_loader(indexed_val_source, train=False, batch_size=8, crop_size=16, workers=1)
    with pytest.raises(ValueError, match="epoch_dataset"):
        _ = loader.stream_dataset


def test_native_val_matches_dali_within_tolerance(tiny_classification):
    """Same decode (libjpeg's accurate IDCT: bit-exact with DALI's CPU decoder), same geometry
    (longer side truncated, crop anchor rounded half to even), antialiased bilinear resize with
    DALI's uint8 rounding. Measured on the 55 val images at crop 64: max |diff| 1.0 grey level
    (a pixel on a .5 rounding boundary), mean 0.0002 levels, 0.01 % of values differ by > 0.01."""
    kw = dict(train=False, batch_size=55, crop_size=64, workers=2)
    (xd, yd), = list(create_classification_loader(tiny_classification / "imagefolder", backend="dali-cpu", **kw))
    (xn, yn), = list(create_classification_loader(tiny_classification / "imagefolder", backend="native", **kw))
    np.testing.assert_array_equal(yd.numpy(), yn.numpy())
    diff = np.abs(xd.numpy() - xn.numpy()) * np.array(IMAGENET_STD)  # back to 0..255 grey levels
    assert diff.max() <= 1.0 + 1e-3, f"max diff {diff.max():.4f} grey levels"
    assert diff.mean() <= 0.01, f"mean diff {diff.mean():.5f} grey levels"
    assert (diff > 0.01).mean() <= 0.001


def test_missing_tfrecord_index_is_a_clear_error(tiny_classification, tmp_path):
    shutil.copytree(tiny_classification / "tfrecord", tmp_path / "tfrecord")
    (tmp_path / "tfrecord" / "val.idx").unlink()
    with pytest.raises(DataError, match=r"val\.idx.*tfrecord2idx"):
        create_classification_loader(tmp_path / "tfrecord", train=False, batch_size=8, crop_size=32)


@pytest.mark.parametrize("backend", ["dali-cpu", "native"])
def test_corrupt_jpeg_is_named(tiny_classification, tmp_path, backend):
    """A JPEG cut short after its header: the error must name the file (neither DALI's nor
    TensorFlow's decoder error does); the check's fast pass refuses it before any decoding."""
    shutil.copytree(tiny_classification / "imagefolder" / "val", tmp_path / "val")
    bad = tmp_path / "val" / "brick" / "0002.jpg"
    bad.write_bytes(bad.read_bytes()[:200] + bytes(50))
    with pytest.raises(DataError, match=r"brick/0002\.jpg cannot be decoded"):  # refused up front by the check
        list(create_classification_loader(tmp_path, train=False, backend=backend, batch_size=8, crop_size=32, workers=1))


def test_declared_shape_mismatch_is_a_clear_error(tiny_classification):
    src = resolve_source(tiny_classification / "imagefolder", "val")
    pipe = create_classification_pipeline(src, train=False, options=PipelineOptions(batch_size=8, num_threads=1),
                                          transform=ClassificationTransform(crop_size=64, output_layout="HWC"))
    with pytest.raises(ValueError, match=r"per-sample shape \(64, 64, 3\) but the dataset declares \(32, 32, 3\)"):
        dali_dataset(pipe, batch_size=8, output_shapes=((8, 32, 32, 3), (8, 1)),
                     output_dtypes=(tf.float32, tf.int64), device_id=None)
    with pytest.raises(ValueError, match=r"dtype float32 but the dataset declares float16"):
        dali_dataset(pipe, batch_size=8, output_shapes=((8, 64, 64, 3), (8, 1)),
                     output_dtypes=(tf.float16, tf.int64), device_id=None)
    with pytest.raises(ValueError, match="must start with the batch size 8"):
        dali_dataset(pipe, batch_size=8, output_shapes=((4, 64, 64, 3), (4, 1)),
                     output_dtypes=(tf.float32, tf.int64), device_id=None)


def test_bad_arguments_are_clear_errors(tiny_classification):
    with pytest.raises(ValueError, match="backend must be one of"):
        create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali")
    with pytest.raises(DataError, match="native TensorFlow backend reads image files or TFRecord"):
        create_classification_loader(tiny_classification / "recordio", train=False, backend="native")
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(RuntimeError, match="needs a GPU visible to TensorFlow"):
            create_classification_loader(tiny_classification / "imagefolder", train=False, backend="dali-gpu")
