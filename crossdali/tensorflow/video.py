"""``create_video_loader`` / ``create_video_dataset``: TensorFlow clip batches from the shared
DALI clip pipeline (``crossdali.common.video``), through ``DALIDataset``.

Backends: ``dali-cpu`` (FFmpeg, VP8/VP9 only; ``/CPU:0``, no GPU needed) and ``dali-gpu``
(NVDEC: VP9, H.264, HEVC, AV1; batches stay on the GPU). Clips are ``(N, F, H, W, C)``
(``layout="NFHWC"``, what Keras' ``Conv3D`` takes) or ``(N, C, F, H, W)``; labels ``(N,)`` int64.
Epochs follow ``crossdali.common.loading.epochs`` through ``crossdali.tensorflow.dali_loader.DALILoader``:
val sees every clip exactly once across shards.
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from crossdali.common.data.sources import DataSource
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.video_loaders import VIDEO_BACKENDS, plan_video_split
from crossdali.common.video import VIDEO_READER_NAME, ClipTransform
from crossdali.tensorflow.dali_loader import NO_DALI_CHECKPOINTS, DALILoader

__all__ = ["VIDEO_BACKENDS", "create_video_dataset", "create_video_loader"]


def _clip_shape(t: ClipTransform, batch: int) -> tuple[int, ...]:
    """DALI's batch of ``batch`` samples: clips, or reads of ``clips_per_read`` clips (an extra axis)."""
    c, f = t.crop_size, t.sequence_length
    clip = (f, c, c, 3) if t.output_layout == "FHWC" else (3, f, c, c)
    return (batch, *((t.clips_per_read,) if t.clips_per_read > 1 else ()), *clip)


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
    checkpointing: bool = False,
    clips_per_read: int | None = None,
    handover: str = "dataset",
    hold_batches: int = 4,
) -> DALILoader:
    """A loader of ``(clips, labels)`` TF batches for the train or val split of ``data``.

    Same arguments and meaning as ``crossdali.pytorch.create_video_loader`` (the layout default
    is channels-last here). ``for clips, labels in loader`` is one epoch; ``loader.dataset`` is
    the ``tf.data.Dataset`` (endless for train: give Keras ``steps_per_epoch=loader.steps_per_epoch``).
    ``validate`` probes every file first (needs PyAV), so a bad one fails with its name and the fix.
    ``checkpointing`` must stay off (DALIDataset cannot restore DALI checkpoints). ``clips_per_read``
    (train): consecutive clips decoded as one read, handed out as clips (see the PyTorch loader).

    Args:
        data: a folder with ``<split>.txt`` file lists or ``<split>/<class>/<video>``, a file list, or a
            resolved ``DataSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        sequence_length: frames per clip.
        stride: distance between the frames of a clip.
        step: distance between the first frames of consecutive clips (default ``sequence_length * stride``).
        crop_size: side of the square output images.
        hflip: mirror probability in training (0 for labels a flip changes).
        layout: ``NCFHW`` or ``NFHWC`` clips.
        workers: DALI's threads, or tf.data's parallel calls (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        validate: probe every file first, so a bad one fails with its name and the fix.
        checkpointing: must stay off: ``DALIDataset`` cannot restore a DALI checkpoint, so ``state_dict`` is
            epoch-level.
        clips_per_read: train only: consecutive clips read as one sequence and handed out as separate clips,
            each with its own crop and flip; ``None``: 3 where the batch and the files allow
            (``crossdali.pytorch.create_video_loader`` says more).
        handover: how iterating the loader takes its batches: ``dataset`` (``DALIDataset``, a copy that waits
            for TensorFlow's queued work), ``dlpack`` (DALI's buffers shared, no copy; see ``DALILoader``) or
            ``auto`` (``dlpack`` where TensorFlow can place them); ``loader.dataset`` is ``DALIDataset`` either way.
        hold_batches: with ``dlpack``, the batches whose DALI buffers stay alive after they are handed out: more
            than the steps a loop runs ahead of the GPU.
    """
    if checkpointing:
        raise ValueError(NO_DALI_CHECKPOINTS)
    split = plan_video_split(data, train=train, backend=backend, batch_size=batch_size, sequence_length=sequence_length,
                             stride=stride, step=step, crop_size=crop_size, hflip=hflip, layout=layout, dtype=dtype,
                             dist=dist, last_batch=last_batch, validate=validate, clips_per_read=clips_per_read,
                             policies=(LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP))
    options = split.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id)
    # the twin runs on the loader's device: the CPU cannot decode H.264
    return DALILoader(split.plan, options, split.build, names=("clips", "labels"), reader_name=VIDEO_READER_NAME,
                      twin_on_cpu=False, output_shapes=(_clip_shape(split.transform, split.plan.batch_size),
                                                        (split.plan.batch_size, split.transform.clips_per_read)),
                      unfold=split.transform.clips_per_read,
                      output_dtypes=(tf.float16 if dtype == "float16" else tf.float32, tf.int64),
                      explain=split.explain, handover=handover, hold_batches=hold_batches)


def create_video_dataset(data: str | Path | DataSource, **kwargs) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of ``create_video_loader`` (same arguments).

    Args:
        data: a folder with ``<split>.txt`` file lists or ``<split>/<class>/<video>``, a file list, or a
            resolved ``DataSource``.
        kwargs: the arguments of the matching ``create_*_loader``.
    """
    return create_video_loader(data, **kwargs).dataset
