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
    clips_per_read: int = 1,
) -> DALILoader:
    """An iterable of ``(clips, labels)`` for the train or val split of ``data``.

    ``data``: a folder with ``<split>.txt`` file lists or ``<split>/<class>/<video>``, a file list,
    or a resolved ``DataSource``. ``sequence_length`` frames per clip, ``stride`` frames apart, a
    new clip every ``step`` frames (default ``sequence_length * stride``). ``dist`` shards by the
    global rank. ``validate`` probes every file first (codec, constant frame rate, length) so a bad
    file fails with its name and the fix instead of being skipped. The result has ``len()``
    (batches per epoch), ``num_samples`` (clips), ``batch_size`` and ``num_classes``; ``checkpointing`` lets
    ``state_dict()`` save DALI's position inside an epoch.

    ``pipelines``: DALI pipelines in this process, each reading its own part of this rank's shard
    with ``batch_size / pipelines`` clips per step (``workers`` threads each), merged into one batch;
    an epoch still has every clip once. ``None``: 1 on the CPU, on the GPU the largest divisor of
    ``batch_size`` up to 14 in training, 7 for val (one reader leaves NVDEC mostly idle: on the H100,
    1080p H.264 in training's order, 1 pipeline read 306 frames/s, 4 1,082, 7 1,759-1,908, 14
    2,196-2,205; see ``crossdali.common.video``). The clip
    order and augmentation differ between values (other shards, other seeds), and a ``state_dict``
    resumes only into a loader with the same ``pipelines``.

    ``clips_per_read`` (train only): DALI reads that many consecutive clips as one sequence and hands
    them out as separate clips, so a file's frames are decoded once for all of them instead of once per
    clip from the key frame before it. Worth it where key frames are further apart than a clip: with a
    key frame every ``clips_per_read * sequence_length * stride`` frames every read starts on one. The
    price: the clips of one read share their crop and flip and arrive in the same batch (the reads
    are shuffled, the clips within one are not), and a file's last clips that do not fill a read are
    not read (the loader logs how many). ``batch_size`` must be a multiple of it, and ``pipelines=None``
    then divides the reads per step. Measured on the H100 (1080p H.264, a key
    frame every 48 frames, 16-frame clips shuffled; ``crossdali.common.video``): 1,748-1,755 frames/s one
    clip at a time, 4,598-4,601 with 3 clips per read and 14 pipelines, ahead of PyNvVideoCodec's 4,443-4,459.
    """
    split = plan_video_split(data, train=train, backend=backend, batch_size=batch_size, sequence_length=sequence_length,
                             stride=stride, step=step, crop_size=crop_size, hflip=hflip, layout=layout, dtype=dtype,
                             dist=dist, last_batch=last_batch, validate=validate, clips_per_read=clips_per_read,
                             pipelines=pipelines, with_frame_num=with_frame_num,
                             require=lambda b: require_cuda(b, "use dali-cpu (VP8/VP9 input only)"))
    options = split.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    return DALILoader(split.plan, options, split.build, **split.loader_args())
