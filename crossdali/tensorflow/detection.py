"""``create_detection_loader`` / ``create_detection_dataset``: SSD300 batches in TensorFlow from the
shared DALI detection pipeline (``crossdali.common.detection``), through ``DALIDataset``.

Same batches as ``crossdali.pytorch.create_detection_loader``: train ``(images (N, 3, 300, 300),
offsets (N, A, 4), labels (N, A) int64)`` with A the SSD300 default boxes
(``crossdali.common.anchors``: 8,732); val ``(images, boxes (N, M, 4), labels (N, M),
image_ids (N,))`` with M the longest box list of the batch. Epochs follow
``crossdali.common.loading.epochs`` through ``crossdali.tensorflow.dali_loader.DALILoader``: val sees every
image exactly once across shards; ``dali-gpu`` batches stay on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from crossdali.common.anchors import ssd300_default_boxes
from crossdali.common.data.coco import DetectionSource, resolve_detection_source
from crossdali.common.detection import (
    READER_NAME,
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    DetectionTransform,
    create_detection_pipeline,
    explain_detection_failure,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import prepare_split
from crossdali.tensorflow.dali_loader import NO_DALI_CHECKPOINTS, DALILoader

__all__ = ["DETECTION_BACKENDS", "create_detection_loader", "create_detection_dataset"]

DETECTION_BACKENDS = ("dali-gpu", "dali-cpu")


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
    checkpointing: bool = False,
    handover: str = "dataset",
    hold_batches: int = 4,
) -> DALILoader:
    """A loader of SSD300 TF batches for the train or val split of a COCO-format folder.

    Same arguments as ``crossdali.pytorch.create_detection_loader`` (no ``native`` backend and
    no ``debug`` outputs here). ``for batch in loader`` is one epoch; ``loader.dataset`` is the
    ``tf.data.Dataset`` (endless for train: give Keras ``steps_per_epoch=loader.steps_per_epoch``).
    ``checkpointing`` must stay off (DALIDataset cannot restore DALI checkpoints).

    Args:
        data: a COCO-format folder (``annotations/instances_{train,val}.json`` and ``{train,val}/``) or a
            resolved ``DetectionSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        workers: DALI's threads, or tf.data's parallel calls (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        transform: the augmentation ranges (default: the pipeline's own preset).
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: must stay off: ``DALIDataset`` cannot restore a DALI checkpoint, so ``state_dict`` is
            epoch-level.
        handover: how iterating the loader takes its batches: ``dataset`` (``DALIDataset``, a copy that waits
            for TensorFlow's queued work), ``dlpack`` (DALI's buffers shared, no copy; see ``DALILoader``) or
            ``auto`` (``dlpack`` where TensorFlow can place them); ``loader.dataset`` is ``DALIDataset`` either way.
        hold_batches: with ``dlpack``, the batches whose DALI buffers stay alive after they are handed out: more
            than the steps a loop runs ahead of the GPU.
    """
    if checkpointing:
        raise ValueError(NO_DALI_CHECKPOINTS)
    plan = prepare_split(data, train=train, backend=backend, backends=DETECTION_BACKENDS,
                         source_type=DetectionSource, resolve=resolve_detection_source, batch_size=batch_size,
                         dist=dist, last_batch=last_batch, what="detection",
                         policies=(LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP))
    source = plan.source
    t = transform or DetectionTransform()
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, hw_decoder_load=hw_decoder_load)
    bs, s = batch_size, t.size
    if train:
        anchors = len(ssd300_default_boxes())
        shapes = ((bs, 3, s, s), (bs, anchors, 4), (bs, anchors))
        dtypes = (tf.float32, tf.float32, tf.int64)
    else:
        shapes = ((bs, 3, s, s), (bs, None, 4), (bs, None), (bs, 1))
        dtypes = (tf.float32, tf.float32, tf.int64, tf.int64)
    return DALILoader(plan, options,
                      lambda opts: create_detection_pipeline(source, train=train, options=opts, transform=t),
                      names=TRAIN_OUTPUTS if train else VAL_OUTPUTS, output_shapes=shapes, output_dtypes=dtypes,
                      reader_name=READER_NAME, flatten=("image_ids",),
                      # val's boxes, labels and image ids come from the reader on the CPU: copied to the GPU
                      host_outputs=not train, explain=lambda e: explain_detection_failure(source, e),
                      handover=handover, hold_batches=hold_batches)


def create_detection_dataset(data: str | Path | DetectionSource, **kwargs) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of ``create_detection_loader`` (same arguments).

    Args:
        data: a COCO-format folder (``annotations/instances_{train,val}.json`` and ``{train,val}/``) or a
            resolved ``DetectionSource``.
        kwargs: the arguments of the matching ``create_*_loader``.
    """
    return create_detection_loader(data, **kwargs).dataset
