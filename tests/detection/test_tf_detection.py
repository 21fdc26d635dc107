"""The TensorFlow DALIDataset wrapper of the detection pipeline (CPU): shapes, exactly-once val over
shards, and the very same boxes, labels and pixels as the shared pipeline run directly.

Runs in the TensorFlow environment (nox -s tests-tensorflow); skipped where TensorFlow is absent."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

from crossdali.common.classification import PipelineOptions  # noqa: E402
from crossdali.common.detection import (  # noqa: E402
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    create_detection_pipeline,
    resolve_detection_source,
)
from crossdali.common.distributed import DistInfo  # noqa: E402
from crossdali.tensorflow.detection import create_detection_loader  # noqa: E402


def test_tf_train_batches(detection_root):
    loader = create_detection_loader(detection_root, train=True, batch_size=8, workers=2)
    assert len(loader) == 12
    images, offsets, labels = next(iter(loader))
    assert images.shape == (8, 3, 300, 300) and images.dtype == tf.float32
    assert offsets.shape == (8, 8732, 4) and labels.shape == (8, 8732) and labels.dtype == tf.int64
    assert int(tf.reduce_sum(tf.cast(labels > 0, tf.int32))) > 0 and int(tf.reduce_max(labels)) <= 5


def test_tf_val_exactly_once_over_shards(detection_root):
    coco = json.loads((detection_root / "annotations" / "instances_val.json").read_text())
    all_ids = sorted(im["id"] for im in coco["images"])
    seen = []
    for rank in range(2):
        loader = create_detection_loader(detection_root, train=False, batch_size=5, workers=1,
                                         dist=DistInfo(rank=rank, world_size=2, local_rank=0, launcher="test"))
        seen += [int(i) for *_, ids in loader for i in ids.numpy()]
    assert sorted(seen) == all_ids


def test_tf_val_identical_to_pipeline(detection_root):
    """What TensorFlow receives is bit-identical to the framework-free pipeline's output."""
    src = resolve_detection_source(detection_root, "val")
    pipe = create_detection_pipeline(src, train=False, options=PipelineOptions(batch_size=8, num_threads=1))
    pipe.build()
    direct = {n: np.array(x.as_tensor()) for n, x in zip(VAL_OUTPUTS, pipe.run())}
    images, boxes, labels, ids = next(iter(create_detection_loader(src, train=False, batch_size=8, workers=1)))
    np.testing.assert_array_equal(ids.numpy(), direct["image_ids"].reshape(-1))
    np.testing.assert_array_equal(labels.numpy(), direct["labels"])
    np.testing.assert_array_equal(boxes.numpy(), direct["boxes"])
    np.testing.assert_array_equal(images.numpy(), direct["images"])


def test_tf_train_identical_to_pipeline(detection_root):
    src = resolve_detection_source(detection_root, "train")
    pipe = create_detection_pipeline(src, train=True, options=PipelineOptions(batch_size=8, num_threads=2, seed=11))
    pipe.build()
    direct = [np.array(x.as_tensor()) for x in pipe.run()]
    batch = next(iter(create_detection_loader(src, train=True, batch_size=8, workers=2, seed=11)))
    for name, got, want in zip(TRAIN_OUTPUTS, batch, direct):
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("handover", ["dataset", "dlpack"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_tf_dali_gpu_batches_stay_on_the_gpu(detection_root, train, handover):
    """Every output of every batch on the GPU, through either hand-over: images, encoded boxes and labels
    (train); images, boxes, labels and image ids (val, whose boxes come from the reader on the CPU)."""
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU visible to TensorFlow (tensorflow-cpu, or no CUDA GPU)")
    loader = create_detection_loader(detection_root, train=train, backend="dali-gpu", batch_size=8, workers=2,
                                     device_id=0, handover=handover)
    seen = 0
    for batch in loader:
        assert all("GPU" in x.device for x in batch), [x.device for x in batch]
        seen += int(batch[0].shape[0])
    assert seen == loader.num_samples > 0


@pytest.mark.parametrize("train", [True, False], ids=["train", "val"])
def test_tf_dlpack_handover_gives_the_dalidataset_batches(detection_root, assert_handovers_agree, train):
    """DALI's buffers shared through DLPack: two epochs of every output equal to ``DALIDataset``'s bit for bit (val:
    boxes and labels padded per batch, image ids from the reader on the CPU)."""
    epochs = assert_handovers_agree(
        lambda handover: create_detection_loader(detection_root, train=train, batch_size=8, workers=2, seed=5,
                                                 handover=handover, hold_batches=2),
        outputs=TRAIN_OUTPUTS if train else VAL_OUTPUTS)
    assert len(epochs[0]) == len(epochs[1]) > 1
