"""The shared RN50 pipelines on the sample data, CPU mode: every reader, train and val."""

from __future__ import annotations

import numpy as np
import pytest

from crossdali.common.classification import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ClassificationTransform,
    PipelineOptions,
    create_classification_pipeline,
)
from crossdali.common.data.sources import resolve_source
from crossdali.common.errors import DataError

FORMATS = {"imagefolder": "imagefolder", "filelist": "imagefolder", "tfrecord": "tfrecord", "recordio": "recordio",
           "webdataset": "webdataset"}
CROP = 48
# Normalized values of pixels 0 and 255: the bounds of any output.
LOW = min((0 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))
HIGH = max((255 - m) / s for m, s in zip(IMAGENET_MEAN, IMAGENET_STD))


def run_batches(source, *, train, n=2, seed=0, batch_size=8, layout="CHW", dtype="float32", shard=(0, 1)):
    pipe = create_classification_pipeline(
        source, train=train,
        options=PipelineOptions(batch_size=batch_size, num_threads=2, seed=seed, shard_id=shard[0], num_shards=shard[1]),
        transform=ClassificationTransform(crop_size=CROP, output_layout=layout, dtype=dtype))
    pipe.build()
    out = []
    for _ in range(n):
        images, labels = pipe.run()
        out.append((np.array(images.as_tensor()), np.array(labels.as_tensor())))
    return out


def _source(tiny, fmt, split):
    return resolve_source(tiny / FORMATS[fmt], split, format=fmt)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_reader_shapes_dtypes_ranges(tiny_classification, fmt, train):
    source = _source(tiny_classification, fmt, "train" if train else "val")
    for images, labels in run_batches(source, train=train):
        assert images.shape == (8, 3, CROP, CROP) and images.dtype == np.float32
        assert labels.shape == (8, 1) and labels.dtype == np.int64
        assert LOW - 1e-4 <= images.min() and images.max() <= HIGH + 1e-4
        assert images.std() > 0.1  # real pixels, not a constant fill
        assert set(labels.ravel()) <= set(range(11))


def test_val_reads_in_order_and_is_deterministic(tiny_classification):
    source = _source(tiny_classification, "imagefolder", "val")
    a, b = run_batches(source, train=False, n=3), run_batches(source, train=False, n=3, seed=99)
    for (ia, la), (ib, lb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)  # no randomness in val, whatever the seed
        np.testing.assert_array_equal(la, lb)
    labels = np.concatenate([lab.ravel() for _, lab in a])
    np.testing.assert_array_equal(labels, np.array(source.labels[:24]))  # unshuffled file order


@pytest.mark.parametrize("fmt", ["imagefolder", "tfrecord", "webdataset"])
def test_train_reproducible_with_seed_and_varies_across_seeds(tiny_classification, fmt):
    source = _source(tiny_classification, fmt, "train")
    a, b, c = (run_batches(source, train=True, seed=s) for s in (7, 7, 8))
    for (ia, la), (ib, lb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(la, lb)
    assert any(not np.array_equal(ia, ic) for (ia, _), (ic, _) in zip(a, c))


def test_train_shuffles_across_classes(tiny_classification):
    source = _source(tiny_classification, "imagefolder", "train")
    (images, labels), = run_batches(source, train=True, n=1, batch_size=32)
    assert len(set(labels.ravel())) > 3  # shuffled across classes, not class-by-class


def test_hwc_float16_layout(tiny_classification):
    source = _source(tiny_classification, "imagefolder", "val")
    (chw, _), = run_batches(source, train=False, n=1)
    (hwc, _), = run_batches(source, train=False, n=1, layout="HWC", dtype="float16")
    assert hwc.shape == (8, CROP, CROP, 3) and hwc.dtype == np.float16
    np.testing.assert_allclose(hwc.astype(np.float32), chw.transpose(0, 2, 3, 1), atol=2e-2)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_val_exactly_once_over_shards_raw_pipeline(indexed_val_source, assert_epoch_coverage, shards):
    """Straight from the pipeline: each shard's reader returns its slice plus padding; the
    padding is what an iterator drops (``crossdali.common.loading.epochs``)."""
    seen = []
    for shard in range(shards):
        pipe = create_classification_pipeline(
            indexed_val_source, train=False,
            options=PipelineOptions(batch_size=8, num_threads=1, shard_id=shard, num_shards=shards),
            transform=ClassificationTransform(crop_size=16))
        pipe.build()
        assert pipe.reader_meta("Reader")["epoch_size"] == 55
        lo, hi = shard * 55 // shards, (shard + 1) * 55 // shards
        labels = []
        while len(labels) < hi - lo:
            labels.extend(np.array(pipe.run()[1].as_tensor()).ravel().tolist())
        seen.append(labels[: hi - lo])
    assert_epoch_coverage(seen, 55)


def test_options_reject_bad_values():
    with pytest.raises(ValueError, match="device_id"):
        PipelineOptions(device="gpu")
    with pytest.raises(ValueError, match="shard_id"):
        PipelineOptions(shard_id=2, num_shards=2)
    with pytest.raises(ValueError, match="hw_decoder_load"):
        PipelineOptions(hw_decoder_load=1.5)
    with pytest.raises(ValueError, match="output_layout"):
        ClassificationTransform(output_layout="NCHW")
    with pytest.raises(ValueError, match="device"):
        PipelineOptions(device="tpu")


# ---- bad input: clear errors that name the path ------------------------------------------

def _image_folder(tmp_path, tiny, classes=("a", "b")):
    import shutil

    src = sorted((tiny / "imagefolder" / "val" / "astronaut").glob("*.jpg"))
    for cls in classes:
        (tmp_path / "val" / cls).mkdir(parents=True)
        for f in src[:3]:
            shutil.copy(f, tmp_path / "val" / cls / f.name)
    return tmp_path


def test_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match=str(tmp_path / "nope")):
        resolve_source(tmp_path / "nope", "val")


def test_no_split_found(tmp_path):
    with pytest.raises(DataError, match="no val split found"):
        resolve_source(tmp_path, "val")


def test_empty_class_dir(tmp_path, tiny_classification):
    root = _image_folder(tmp_path, tiny_classification)
    (root / "val" / "c_empty").mkdir()
    with pytest.raises(DataError, match="c_empty has no images"):
        resolve_source(root, "val")


def test_no_images_at_all(tmp_path):
    (tmp_path / "val").mkdir()
    with pytest.raises(DataError, match="no class sub-folders"):
        resolve_source(tmp_path, "val")


def test_gif_named_jpg(tmp_path, tiny_classification):
    from PIL import Image

    root = _image_folder(tmp_path, tiny_classification)
    gif = root / "val" / "b" / "fake.jpg"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(gif, format="GIF")
    with pytest.raises(DataError, match=r"fake\.jpg is a GIF file"):
        resolve_source(root, "val")


def test_corrupt_jpeg_named_at_decode_time(tmp_path, tiny_classification):
    from crossdali.common.data.sources import explain_decode_failure

    root = _image_folder(tmp_path, tiny_classification)
    bad = root / "val" / "b" / "broken.jpg"
    good = (root / "val" / "a").glob("*.jpg").__next__().read_bytes()
    bad.write_bytes(good[:300] + bytes(range(256)) * 8)  # valid header, garbage entropy data
    source = resolve_source(root, "val", validate=False)  # skip the check (it refuses the file up front)
    pipe = create_classification_pipeline(source, train=False, options=PipelineOptions(batch_size=7, num_threads=1),
                                          transform=ClassificationTransform(crop_size=16))
    pipe.build()
    with pytest.raises(RuntimeError) as info:
        pipe.run()
    err = explain_decode_failure(source, info.value)
    assert isinstance(err, DataError) and str(bad) in str(err)


def _epoch_labels(source, *, checkpointing: bool, epochs: int = 2, batch_size: int = 32) -> list[list[int]]:
    pipe = create_classification_pipeline(
        source, train=True, options=PipelineOptions(batch_size=batch_size, num_threads=2, seed=3,
                                                    checkpointing=checkpointing),
        transform=ClassificationTransform(crop_size=CROP))
    pipe.build()
    steps = -(-source.num_samples // batch_size)  # the reader pads the last batch of each epoch
    out = []
    for _ in range(epochs):
        labels = [int(x) for _ in range(steps) for x in np.array(pipe.run()[1].as_tensor()).ravel()]
        out.append(labels[: source.num_samples])
    return out


def test_checkpointing_is_on_by_default_because_it_changes_later_epochs(indexed_val_source):
    """DALI's shuffle_after_epoch orders epochs 2+ differently with checkpointing on (the first epoch
    is the same): every framework's pipelines turn it on, so all of them see the same epochs."""
    assert PipelineOptions().checkpointing
    source = indexed_val_source  # labels = sample indices
    with_ckpt, without = _epoch_labels(source, checkpointing=True), _epoch_labels(source, checkpointing=False)
    for epoch in with_ckpt + without:
        assert sorted(epoch) == list(range(source.num_samples))  # each epoch: every sample once
    assert with_ckpt[0] == without[0]
    assert with_ckpt[1] != without[1]
