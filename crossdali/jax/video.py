"""``create_video_loader``: ``(clips, labels)`` ``jax.Array`` batches from the shared DALI clip pipeline.

Backends: ``dali-gpu`` (NVDEC; VP9, H.264, HEVC, AV1; arrays on the JAX GPU device) and
``dali-cpu`` (FFmpeg on the CPU; VP8/VP9 only; arrays on JAX's CPU device). Clips are
``(N, F, H, W, C)`` (``layout="NFHWC"``, the default: what flax's 3-D convolutions take) or
``(N, C, F, H, W)``; labels ``(N,)`` int. Epochs follow ``crossdali.common.epochs``: val sees
every clip exactly once across ranks.
"""

from __future__ import annotations

from pathlib import Path

from crossdali.common.distributed import DistInfo
from crossdali.common.loaders import prepare_split
from crossdali.common.sources import DataSource
from crossdali.common.video import (
    VIDEO_READER_NAME,
    ClipCounter,
    ClipTransform,
    create_clip_pipeline,
    default_video_pipelines,
    explain_video_failure,
    read_batch_size,
    resolve_video_source,
)
from crossdali.jax.loaders import DALILoader, _no_native, require_gpu

__all__ = ["VIDEO_BACKENDS", "create_video_loader"]

VIDEO_BACKENDS = ("dali-gpu", "dali-cpu")
_LAYOUTS = {"NCFHW": "CFHW", "NFHWC": "FHWC"}


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
    with_frame_num: bool = False,
    validate: bool = True,
    checkpointing: bool = True,
    pipelines: int | None = None,
    clips_per_read: int = 1,
) -> DALILoader:
    """An iterable of ``(clips, labels)`` for the train or val split of ``data``.

    Same arguments as ``crossdali.pytorch.create_video_loader``; only the ``layout`` default
    differs (``"NFHWC"``, channels last as flax wants). ``validate`` probes every file with PyAV
    first (codec, constant frame rate, length) so a bad file fails with its name and the fix.
    ``pipelines`` splits this rank's shard over several DALI pipelines merged into one batch (as
    in the PyTorch loader, whose docstring says when it helps).
    The result implements ``crossdali.common.loaders.Loader``.
    """
    _no_native(backend)
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
    transform = ClipTransform(sequence_length=sequence_length, stride=stride, step=step, crop_size=crop_size,
                              hflip=hflip if train else 0.0, output_layout=_LAYOUTS[layout], dtype=dtype,
                              clips_per_read=clips_per_read)
    device = "gpu" if backend == "dali-gpu" else "cpu"
    # DALI's batch: reads of clips_per_read clips
    reads = read_batch_size(batch_size, clips_per_read, train=train, pipelines=pipelines)
    if pipelines is None:
        pipelines = default_video_pipelines(device, batch_size, train=train, clips_per_read=clips_per_read)

    # clips per epoch (probing the files also validates them) and the DALI reader they are counted for
    count = ClipCounter(device=device, transform=transform, shuffle=train, validate=validate)

    require_gpu(backend, "use dali-cpu (VP8/VP9 input only)")
    plan = prepare_split(data, train=train, backend=backend, backends=VIDEO_BACKENDS, source_type=DataSource,
                         resolve=resolve_video_source, batch_size=reads, dist=dist, last_batch=last_batch,
                         count=count, what="video", pipelines=pipelines)
    source = plan.source
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    names = ("clips", "labels") + (("frame_num",) if with_frame_num else ())
    return DALILoader(plan, options,
                      lambda opts: create_clip_pipeline(source, train=train, options=opts, transform=transform,
                                                        with_frame_num=with_frame_num, validate=False,
                                                        reader=count.reader),
                      names=names, reader_name=VIDEO_READER_NAME, flatten=("labels", "frame_num"),
                      reader_kind=count.reader, unfold=clips_per_read,
                      explain=lambda e: explain_video_failure(source, e, device=device))
