"""The shared start of every framework's ``create_video_loader``: arguments checked, files probed and
counted, the split planned, and the pipeline builder its DALI loader runs.

The PyTorch, JAX and TensorFlow loaders differ only in their iterator (and in TF's fixed output
shapes), so what they decide about clips lives here once (``plan_video_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from crossdali.common.data.sources import DataSource
from crossdali.common.data.videos import ClipCounter, check_videos, resolve_video_source
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import SplitPlan, prepare_split
from crossdali.common.video import (
    VIDEO_READER_NAME,
    ClipTransform,
    create_clip_pipeline,
    default_clips_per_read,
    default_video_pipelines,
    explain_video_failure,
    read_batch_size,
)

__all__ = ["VIDEO_BACKENDS", "VIDEO_LAYOUTS", "VideoSplit", "plan_video_split"]

VIDEO_BACKENDS = ("dali-gpu", "dali-cpu")
#: a loader's ``layout`` (batch axis first) -> the clip layout the pipeline writes
VIDEO_LAYOUTS = {"NCFHW": "CFHW", "NFHWC": "FHWC"}


@dataclass(frozen=True)
class VideoSplit:
    """A planned clip split: what a framework's DALI loader is built from."""

    plan: SplitPlan
    transform: ClipTransform
    count: ClipCounter  #: its ``reader`` is the DALI reader the clips were counted for
    device: str  #: "gpu" or "cpu"
    with_frame_num: bool = False

    def loader_args(self) -> dict:
        """The DALI loader's keyword arguments besides the plan, options and builder (PyTorch's and JAX's
        ``DALILoader``): output names, the reader it sizes epochs by, reads unfolded into clips."""
        names = ("clips", "labels") + (("frame_num",) if self.with_frame_num else ())
        return dict(names=names, reader_name=VIDEO_READER_NAME, flatten=("labels", "frame_num"),
                    reader_kind=self.count.reader, unfold=self.transform.clips_per_read, explain=self.explain)

    def build(self, options):
        """The clip pipeline for one of the loader's pipeline options (files already probed)."""
        return create_clip_pipeline(self.plan.source, train=self.plan.train, options=options, transform=self.transform,
                                    with_frame_num=self.with_frame_num, validate=False, reader=self.count.reader)

    def explain(self, error: Exception) -> Exception:
        """A DALI failure while reading, named by file where it can be (``explain_video_failure``)."""
        return explain_video_failure(self.plan.source, error, device=self.device)


def plan_video_split(
    data: str | Path | DataSource,
    *,
    train: bool,
    backend: str,
    batch_size: int,
    sequence_length: int,
    stride: int,
    step: int | None,
    crop_size: int,
    hflip: float,
    layout: str,
    dtype: str,
    dist: DistInfo | None,
    last_batch: str | None,
    validate: bool,
    clips_per_read: int | None = None,
    pipelines: int | None = 1,
    with_frame_num: bool = False,
    require: Callable[[str], None] | None = None,
    policies: tuple[LastBatchPolicy, ...] | None = None,
) -> VideoSplit:
    """Check the arguments, probe and count the files, and plan this rank's shard.

    ``pipelines=None`` picks ``default_video_pipelines``; ``require(backend)`` (the framework's GPU
    check) runs after the arguments are checked and before any file is read; ``policies``: the
    last-batch policies the framework's loader supports (``prepare_split``'s default if None);
    ``clips_per_read=None`` picks ``default_clips_per_read`` (the files are probed first, once, to
    find the shortest).
    """
    if layout not in VIDEO_LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(VIDEO_LAYOUTS)}, got {layout!r}")
    transform = ClipTransform(sequence_length=sequence_length, stride=stride, step=step, crop_size=crop_size,
                              hflip=hflip if train else 0.0, output_layout=VIDEO_LAYOUTS[layout], dtype=dtype)
    device = "gpu" if backend == "dali-gpu" else "cpu"
    infos, required = None, clips_per_read is None and require is not None
    if clips_per_read is None:
        if require is not None:  # before the files are read
            require(backend)
        if train and validate and backend in VIDEO_BACKENDS:
            data = data if isinstance(data, DataSource) else resolve_video_source(data, "train")
            if data.files:  # probed once here, counted below without probing again
                infos = check_videos(data.files, device=device, transform=transform)
        clips_per_read = default_clips_per_read(batch_size, train=train, transform=transform, pipelines=pipelines,
                                                num_frames=[i.num_frames for i in infos or ()])
    transform = replace(transform, clips_per_read=clips_per_read)
    reads = read_batch_size(batch_size, clips_per_read, train=train, pipelines=pipelines)
    if pipelines is None:
        pipelines = default_video_pipelines(device, batch_size, train=train, clips_per_read=clips_per_read)
    # clips per epoch (probing the files also validates them) and the DALI reader they are counted for
    count = ClipCounter(device=device, transform=transform, shuffle=train, validate=validate, infos=infos)
    if require is not None and not required:
        require(backend)
    plan = prepare_split(data, train=train, backend=backend, backends=VIDEO_BACKENDS, source_type=DataSource,
                         resolve=resolve_video_source, batch_size=reads, dist=dist, last_batch=last_batch,
                         count=count, what="video", pipelines=pipelines,
                         **({"policies": policies} if policies is not None else {}))
    # plan.batch_size is DALI's batch: reads of clips_per_read clips
    return VideoSplit(plan=plan, transform=transform, count=count, device=device, with_frame_num=with_frame_num)
