"""``create_video_loader``: (clips, labels) torch batches from the shared DALI clip pipeline.

Backends: ``dali-gpu`` (NVDEC; VP9, H.264, HEVC, AV1; tensors on ``cuda:<device_id>``) and
``dali-cpu`` (FFmpeg on the CPU; VP8/VP9 only; tensors on the CPU). Clips are ``(N, C, F, H, W)``
(``layout="NCFHW"``, what torchvision's video models take) or ``(N, F, H, W, C)``; labels ``(N,)``
int64. Epochs follow ``crossdali.common.epochs``: val sees every clip exactly once across ranks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from crossdali.common.classification import PipelineOptions
from crossdali.common.distributed import DistInfo
from crossdali.common.epochs import LastBatchPolicy, batches_per_epoch, choose_last_batch_policy, log_epoch_plan
from crossdali.common.sources import DataSource
from crossdali.common.video import (
    VIDEO_READER_NAME,
    ClipTransform,
    check_videos,
    clips_per_epoch,
    create_clip_pipeline,
    explain_video_failure,
    resolve_video_source,
)

__all__ = ["VIDEO_BACKENDS", "DALIVideoLoader", "create_video_loader"]

log = logging.getLogger(__name__)

VIDEO_BACKENDS = ("dali-gpu", "dali-cpu")
_LAYOUTS = {"NCFHW": "CFHW", "NFHWC": "FHWC"}


class DALIVideoLoader:
    """Wraps DALI's PyTorch iterator: ``(clips, labels)`` tuples (``+ frame_num`` with
    ``with_frame_num``), empty batches skipped, reader failures turned into errors naming the file."""

    def __init__(self, source: DataSource, *, train: bool, options: PipelineOptions, transform: ClipTransform,
                 policy: LastBatchPolicy, num_clips: int, with_frame_num: bool = False) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # defer: DALI's torch plugin

        self.source, self.device = source, options.device
        self.batch_size = options.batch_size
        self.num_classes = source.num_classes
        self.num_clips = num_clips
        self.policy = policy
        self._len = batches_per_epoch(num_clips, batch_size=options.batch_size, num_shards=options.num_shards,
                                      policy=policy)
        names = ["clips", "labels"] + (["frame_num"] if with_frame_num else [])
        try:
            pipe = create_clip_pipeline(source, train=train, options=options, transform=transform,
                                        with_frame_num=with_frame_num, validate=False)
            self._iter = DALIGenericIterator([pipe], names, reader_name=VIDEO_READER_NAME,
                                             last_batch_policy=policy, auto_reset=True)
        except RuntimeError as e:
            raise explain_video_failure(source, e, device=options.device) from e

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        it = iter(self._iter)
        while True:
            try:
                batch = next(it)[0]
            except StopIteration:
                return
            except RuntimeError as e:
                raise explain_video_failure(self.source, e, device=self.device) from e
            if batch["clips"].shape[0] == 0:
                continue  # a shard shorter than the longest one ends with an empty batch
            out = (batch["clips"], batch["labels"].view(-1))
            if "frame_num" in batch:
                out += (batch["frame_num"].view(-1),)
            yield out


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
) -> DALIVideoLoader:
    """An iterable of ``(clips, labels)`` for the train or val split of ``data``.

    ``data``: a folder with ``<split>.txt`` file lists or ``<split>/<class>/<video>``, a file list,
    or a resolved ``DataSource``. ``sequence_length`` frames per clip, ``stride`` frames apart, a
    new clip every ``step`` frames (default ``sequence_length * stride``). ``dist`` shards by the
    global rank. ``validate`` probes every file first (codec, constant frame rate, length) so a bad
    file fails with its name and the fix instead of being skipped. The result has ``len()``
    (batches per epoch), ``num_clips``, ``batch_size`` and ``num_classes``.
    """
    if backend not in VIDEO_BACKENDS:
        raise ValueError(f"video backend must be one of {VIDEO_BACKENDS}, got {backend!r}")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if isinstance(data, DataSource) else resolve_video_source(data, split)
    transform = ClipTransform(sequence_length=sequence_length, stride=stride, step=step, crop_size=crop_size,
                              hflip=hflip if train else 0.0, output_layout=_LAYOUTS[layout], dtype=dtype)
    device = "gpu" if backend == "dali-gpu" else "cpu"
    if device == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("--data-backend dali-gpu needs a CUDA GPU and none is visible; use dali-cpu "
                           "(VP8/VP9 input only)")
    if validate:
        num_clips = clips_per_epoch(check_videos(source.files, device=device, transform=transform), transform)
    else:
        num_clips = source.num_samples  # unknown without probing: a lower bound for len()
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    if dist.is_main:
        log_epoch_plan(f"video {split} ({backend}, {source.num_samples} files at {source.root})", num_clips,
                       batch_size=batch_size, num_shards=dist.world_size, policy=policy)
    options = PipelineOptions(
        batch_size=batch_size, device=device,
        device_id=(device_id if device_id is not None else dist.local_rank) if device == "gpu" else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size)
    return DALIVideoLoader(source, train=train, options=options, transform=transform, policy=policy,
                           num_clips=num_clips, with_frame_num=with_frame_num)
