"""``create_video_loader``: (clips, labels) torch batches from the shared DALI clip pipeline.

Backends: ``dali-gpu`` (NVDEC; VP9, H.264, HEVC, AV1; tensors on ``cuda:<device_id>``) and
``dali-cpu`` (FFmpeg on the CPU; VP8/VP9 only; tensors on the CPU). Clips are ``(N, C, F, H, W)``
(``layout="NCFHW"``, what torchvision's video models take) or ``(N, F, H, W, C)``; labels ``(N,)``
int64. Epochs follow ``crossdali.common.loading.epochs``: val sees every clip exactly once across ranks.
"""

from __future__ import annotations

from pathlib import Path

from crossdali.common.data.sources import DataSource
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.video_loaders import VIDEO_BACKENDS, plan_video_split
from crossdali.pytorch.loaders import DALILoader, require_cuda

__all__ = ["VIDEO_BACKENDS", "create_video_loader"]


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
    layout: str = "NCFHW",
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    dtype: str = "float32",
    last_batch: str | None = None,
    with_frame_num: bool = False,
    validate: bool = True,
    checkpointing: bool = True,
    pipelines: int | None = None,
    clips_per_read: int | None = None,
) -> DALILoader:
    """PyTorch ``(clips, labels)`` batches of the train or val split of a video dataset.

    Returns a ``DALILoader`` with ``len()`` (batches per epoch), ``num_samples`` (clips),
    ``batch_size`` and ``num_classes``; clips ``(N, C, F, H, W)`` float (``layout="NCFHW"``) or
    ``(N, F, H, W, C)``, labels ``(N,)`` int64.

    Args:
        data: a folder with ``<split>.txt`` file lists or ``<split>/<class>/<video>``, a file list,
            or a resolved ``DataSource``.
        train: the train split (clips shuffled, random crop and flip) or val (every clip once).
        backend: ``dali-gpu`` (NVDEC) or ``dali-cpu`` (FFmpeg; VP8/VP9/MJPEG only).
        batch_size: clips per batch on this rank.
        sequence_length: frames per clip.
        stride: distance between the frames of a clip.
        step: distance between the first frames of consecutive clips (default
            ``sequence_length * stride``: clips touch without overlapping).
        crop_size: side of the square output frames.
        hflip: mirror probability in training (0 for labels a flip changes).
        layout: ``NCFHW`` or ``NFHWC``.
        workers: DALI's threads per pipeline.
        seed: shuffle and augmentation seed.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` clips.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        with_frame_num: add each clip's first frame number as a third output.
        validate: probe every file first (codec, constant frame rate, length), so a bad file fails
            with its name and the fix instead of being skipped.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch.
        pipelines: DALI pipelines in this process, each reading its own part of this rank's shard
            with ``batch_size / pipelines`` clips per step, merged into one batch; an epoch still has
            every clip once. ``None``: 1 on the CPU; on the GPU the largest divisor of ``batch_size``
            up to ``crossdali.common.video.GPU_TRAIN_PIPELINES`` in training and
            ``GPU_VIDEO_PIPELINES`` for val, since one reader leaves NVDEC mostly idle
            (docs/benchmarks.md#video-decoding). The clip order and augmentation differ between
            values, and a ``state_dict`` resumes only into a loader with the same count.
        clips_per_read: train only: DALI reads that many consecutive clips as one sequence and hands
            them out as separate clips, each with its own random crop and flip, so a file's frames are
            decoded once for all of them instead of once per clip from the key frame before it
            (docs/benchmarks.md#video-decoding). ``None`` (default): 1 for val; in training
            ``crossdali.common.video.DEFAULT_CLIPS_PER_READ`` (3), or the largest smaller count that
            divides ``batch_size`` and fits the shortest file (``default_clips_per_read``). The clips of
            one read arrive in the same batch; a file's last clips that do not fill a read are not read
            (the loader logs how many; docs/video.md says what this costs). ``batch_size`` must be a
            multiple of it. 1 reads every clip on its own.
    """
    split = plan_video_split(data, train=train, backend=backend, batch_size=batch_size, sequence_length=sequence_length,
                             stride=stride, step=step, crop_size=crop_size, hflip=hflip, layout=layout, dtype=dtype,
                             dist=dist, last_batch=last_batch, validate=validate, clips_per_read=clips_per_read,
                             pipelines=pipelines, with_frame_num=with_frame_num,
                             require=lambda b: require_cuda(b, "use dali-cpu (VP8/VP9 input only)"))
    options = split.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    return DALILoader(split.plan, options, split.build, **split.loader_args())
