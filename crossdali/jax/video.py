"""``create_video_loader``: ``(clips, labels)`` ``jax.Array`` batches from the shared DALI clip pipeline.

Backends: ``dali-gpu`` (NVDEC; VP9, H.264, HEVC, AV1; arrays on the JAX GPU device) and
``dali-cpu`` (FFmpeg on the CPU; VP8/VP9 only; arrays on JAX's CPU device). Clips are
``(N, F, H, W, C)`` (``layout="NFHWC"``, the default: what flax's 3-D convolutions take) or
``(N, C, F, H, W)``; labels ``(N,)`` int. Epochs follow ``crossdali.common.loading.epochs``: val sees
every clip exactly once across ranks.
"""

from __future__ import annotations

from pathlib import Path

from crossdali.common.data.sources import DataSource
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.video_loaders import VIDEO_BACKENDS, plan_video_split
from crossdali.jax.loaders import DALILoader, _no_native, require_gpu

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
    clips_per_read: int | None = None,
) -> DALILoader:
    """An iterable of ``(clips, labels)`` for the train or val split of ``data``.

    Same arguments as ``crossdali.pytorch.create_video_loader``; only the ``layout`` default
    differs (``"NFHWC"``, channels last as flax wants). ``validate`` probes every file with PyAV
    first (codec, constant frame rate, length) so a bad file fails with its name and the fix.
    ``pipelines`` splits this rank's shard over several DALI pipelines merged into one batch (as
    in the PyTorch loader, whose docstring says when it helps).
    The result implements ``crossdali.common.loading.loaders.Loader``.

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
        workers: DALI's threads.
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        with_frame_num: add each clip's first frame number as a third output.
        validate: probe every file first, so a bad one fails with its name and the fix.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        pipelines: DALI pipelines in this process, each reading its own part of the shard
            (``crossdali.pytorch.create_video_loader`` says more).
        clips_per_read: train only: consecutive clips read as one sequence and handed out as separate clips,
            each with its own crop and flip; ``None``: 3 where the batch and the files allow
            (``crossdali.pytorch.create_video_loader`` says more).
    """
    _no_native(backend)
    split = plan_video_split(data, train=train, backend=backend, batch_size=batch_size, sequence_length=sequence_length,
                             stride=stride, step=step, crop_size=crop_size, hflip=hflip, layout=layout, dtype=dtype,
                             dist=dist, last_batch=last_batch, validate=validate, clips_per_read=clips_per_read,
                             pipelines=pipelines, with_frame_num=with_frame_num,
                             require=lambda b: require_gpu(b, "use dali-cpu (VP8/VP9 input only)"))
    options = split.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    return DALILoader(split.plan, options, split.build, **split.loader_args())
