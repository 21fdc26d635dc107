"""``create_detection_loader`` / ``create_detection_dataset``: SSD300 batches in TensorFlow from the
shared DALI detection pipeline (``crossdali.common.detection``), through ``DALIDataset``.

Same batches as ``crossdali.pytorch.create_detection_loader``: train ``(images (N, 3, 300, 300),
offsets (N, 8732, 4), labels (N, 8732) int64)``; val ``(images, boxes (N, M, 4), labels (N, M),
image_ids (N,))`` with M the longest box list of the batch. Epochs follow ``crossdali.common.epochs``
with the same padding bookkeeping as the classification wrapper (``EpochPlan``): val sees every
image exactly once across shards.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import tensorflow as tf

from crossdali.common.classification import PipelineOptions
from crossdali.common.detection import (
    READER_NAME,
    DetectionSource,
    DetectionTransform,
    create_detection_pipeline,
    resolve_detection_source,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.epochs import choose_last_batch_policy, log_epoch_plan
from crossdali.tensorflow.datasets import EpochPlan, TFClassificationLoader, check_pipeline_outputs, dali_dataset

__all__ = ["DETECTION_BACKENDS", "create_detection_loader", "create_detection_dataset"]

log = logging.getLogger(__name__)

DETECTION_BACKENDS = ("dali-gpu", "dali-cpu")


def _apply_plan(stream: tf.data.Dataset, plan: EpochPlan, *, train: bool) -> tf.data.Dataset:
    """Drop and trim the reader's padded batches (see ``crossdali.tensorflow.datasets``); ids to (N,)."""
    table = tf.constant(plan.valid)
    per_epoch, cycle = plan.batches_per_reader_epoch, plan.valid.shape[0]

    def rows(i):
        return table[(i // per_epoch) % cycle, i % per_epoch]

    def trim(i, batch):
        out = tuple(x[: rows(i)] for x in batch)
        return out if train else (*out[:3], tf.reshape(out[3], [-1]))

    return (stream.enumerate().filter(lambda i, batch: rows(i) > 0).map(trim)
            .apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)))


def create_detection_loader(
    data: str | Path | DetectionSource,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 32,
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    hw_decoder_load: float = 1.0,
    transform: DetectionTransform | None = None,
    last_batch: str | None = None,
) -> TFClassificationLoader:
    """A loader of SSD300 TF batches for the train or val split of a COCO-format folder.

    Same arguments as ``crossdali.pytorch.create_detection_loader``. ``for batch in loader`` is
    one epoch; ``loader.dataset`` is the ``tf.data.Dataset`` (endless for train: give Keras
    ``steps_per_epoch=loader.steps_per_epoch``).
    """
    if backend not in DETECTION_BACKENDS:
        raise ValueError(f"detection backend must be one of {DETECTION_BACKENDS}, got {backend!r}")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if isinstance(data, DetectionSource) else resolve_detection_source(data, split)
    t = transform or DetectionTransform()
    device = "gpu" if backend == "dali-gpu" else "cpu"
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    options = PipelineOptions(
        batch_size=batch_size, device=device,
        device_id=(device_id if device_id is not None else dist.local_rank) if device == "gpu" else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size,
        hw_decoder_load=hw_decoder_load)
    bs, s = batch_size, t.size
    if train:
        shapes = ((bs, 3, s, s), (bs, 8732, 4), (bs, 8732))
        dtypes = (tf.float32, tf.float32, tf.int64)
    else:
        shapes = ((bs, 3, s, s), (bs, None, 4), (bs, None), (bs, 1))
        dtypes = (tf.float32, tf.float32, tf.int64, tf.int64)
    # a one-image CPU twin sizes the epochs from the reader's metadata and checks the declared
    # shapes before DALIDataset runs (DALIDataset itself knows nothing of epochs)
    twin = create_detection_pipeline(source, train=train, transform=t, options=replace(
        options, batch_size=1, device="cpu", device_id=None, num_threads=1, prefetch_queue_depth=1))
    check_pipeline_outputs(twin, output_shapes=[(1, *x[1:]) for x in shapes], output_dtypes=dtypes)
    plan = EpochPlan.from_reader_meta(twin.reader_meta(READER_NAME), batch_size=bs, policy=policy)
    del twin
    if dist.is_main:
        log_epoch_plan(f"detection {split} ({backend}, {source.annotations_file})", source.num_images,
                       batch_size=bs, num_shards=dist.world_size, policy=policy)
    pipe = create_detection_pipeline(source, train=train, options=options, transform=t)
    raw = dali_dataset(pipe, batch_size=bs, output_shapes=shapes, output_dtypes=dtypes,
                       device_id=options.pipeline_device_id, check_outputs=False)
    stream = _apply_plan(raw, plan, train=train)
    dataset = stream if train else stream.take(plan.steps(0))  # val: one epoch, re-iterable
    return TFClassificationLoader(dataset, stream=stream, steps=plan, batch_size=bs, num_classes=source.num_classes,
                                  num_samples=source.num_images, backend=backend)


def create_detection_dataset(data: str | Path | DetectionSource, **kwargs) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of ``create_detection_loader`` (same arguments)."""
    return create_detection_loader(data, **kwargs).dataset
