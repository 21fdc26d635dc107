"""``create_video_loader`` / ``create_video_dataset``: TensorFlow clip batches from the shared
DALI clip pipeline (``crossdali.common.video``), through ``DALIDataset``.

Backends: ``dali-cpu`` (FFmpeg, VP8/VP9 only; ``/cpu:0``, no GPU needed) and ``dali-gpu``
(NVDEC: VP9, H.264, HEVC, AV1). Clips are ``(N, F, H, W, C)`` (``layout="NFHWC"``, what Keras'
``Conv3D`` takes) or ``(N, C, F, H, W)``; labels ``(N,)`` int64. Epochs follow
``crossdali.common.epochs`` with the same padding bookkeeping as the classification wrapper
(``crossdali.tensorflow.datasets.EpochPlan``): val sees every clip exactly once across shards.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import tensorflow as tf

from crossdali.common.classification import PipelineOptions
from crossdali.common.distributed import DistInfo
from crossdali.common.epochs import choose_last_batch_policy, log_epoch_plan
from crossdali.common.sources import DataSource
from crossdali.common.video import (
    VIDEO_READER_NAME,
    ClipTransform,
    check_videos,
    create_clip_pipeline,
    explain_video_failure,
    resolve_video_source,
)
from crossdali.tensorflow.datasets import (
    EpochPlan,
    TFClassificationLoader,
    _apply_plan,
    check_pipeline_outputs,
    dali_dataset,
)

__all__ = ["VIDEO_BACKENDS", "create_video_dataset", "create_video_loader"]

log = logging.getLogger(__name__)

VIDEO_BACKENDS = ("dali-gpu", "dali-cpu")
_LAYOUTS = {"NCFHW": "CFHW", "NFHWC": "FHWC"}


def _clip_shape(t: ClipTransform, batch: int) -> tuple[int, ...]:
    c, f = t.crop_size, t.sequence_length
    return (batch, f, c, c, 3) if t.output_layout == "FHWC" else (batch, 3, f, c, c)


def create_video_loader(
    data: str | Path | DataSource,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 8,
    sequence_length: int = 8,
    stride: int = 1,
    step: int | None = None,
    crop_size: int = 112,
    hflip: float = 0.5,
    layout: str = "NFHWC",
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    dtype: str = "float32",
    last_batch: str | None = None,
    validate: bool = True,
) -> TFClassificationLoader:
    """A loader of ``(clips, labels)`` TF batches for the train or val split of ``data``.

    Same arguments and meaning as ``crossdali.pytorch.create_video_loader`` (the layout default
    is channels-last here). ``for clips, labels in loader`` is one epoch; ``loader.dataset`` is
    the ``tf.data.Dataset`` (endless for train: give Keras ``steps_per_epoch=loader.steps_per_epoch``).
    ``validate`` probes every file first (needs PyAV), so a bad one fails with its name and the fix.
    """
    if backend not in VIDEO_BACKENDS:
        raise ValueError(f"video backend must be one of {VIDEO_BACKENDS}, got {backend!r}")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if isinstance(data, DataSource) else resolve_video_source(data, split)
    t = ClipTransform(sequence_length=sequence_length, stride=stride, step=step, crop_size=crop_size,
                      hflip=hflip if train else 0.0, output_layout=_LAYOUTS[layout], dtype=dtype)
    device = "gpu" if backend == "dali-gpu" else "cpu"
    if validate:
        check_videos(source.files, device=device, transform=t)
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    options = PipelineOptions(
        batch_size=batch_size, device=device,
        device_id=(device_id if device_id is not None else dist.local_rank) if device == "gpu" else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size)
    shapes = (_clip_shape(t, batch_size), (batch_size, 1))
    dtypes = (tf.float16 if dtype == "float16" else tf.float32, tf.int64)

    # A one-clip twin (on the same device: the CPU cannot decode H.264) sizes the epochs from the
    # reader's metadata and checks the declared shapes before DALIDataset runs (DALIDataset
    # itself knows nothing of epochs).
    twin_opts = replace(options, batch_size=1, num_threads=1, prefetch_queue_depth=1, initial_fill=1)
    try:
        twin = create_clip_pipeline(source, train=train, options=twin_opts, transform=t, validate=False)
        check_pipeline_outputs(twin, output_shapes=[(1, *s[1:]) for s in shapes], output_dtypes=dtypes)
    except RuntimeError as e:
        raise explain_video_failure(source, e, device=device) from e
    meta = twin.reader_meta(VIDEO_READER_NAME)
    del twin
    plan = EpochPlan.from_reader_meta(meta, batch_size=batch_size, policy=policy)
    num_clips = int(meta["epoch_size"])
    if dist.is_main:
        log_epoch_plan(f"video {split} ({backend}, {source.num_samples} files at {source.root})", num_clips,
                       batch_size=batch_size, num_shards=dist.world_size, policy=policy)

    pipe = create_clip_pipeline(source, train=train, options=options, transform=t, validate=False)
    raw = dali_dataset(pipe, batch_size=batch_size, output_shapes=shapes, output_dtypes=dtypes,
                       device_id=options.pipeline_device_id, check_outputs=False)
    stream = _apply_plan(raw, plan)
    dataset = stream if train else stream.take(plan.steps(0))  # val: one epoch, re-iterable
    return TFClassificationLoader(dataset, stream=stream, steps=plan, batch_size=batch_size,
                                  num_classes=source.num_classes, num_samples=num_clips, backend=backend)


def create_video_dataset(data: str | Path | DataSource, **kwargs) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of ``create_video_loader`` (same arguments)."""
    return create_video_loader(data, **kwargs).dataset
