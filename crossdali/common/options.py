"""How a DALI pipeline runs (``PipelineOptions``) and the one place a backend name becomes options.

Every pipeline in ``crossdali.common`` (classification, detection, video) takes a
``PipelineOptions``; every framework wrapper builds it through ``pipeline_options`` (or
``SplitPlan.pipeline_options``), so "dali-gpu on the local rank's GPU, sharded by the global rank"
is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from crossdali.common.distributed import DistInfo
from crossdali.common.loading.global_order import GlobalOrder

__all__ = ["DALI_BACKENDS", "CLASSIFICATION_BACKENDS", "PipelineOptions", "check_backend", "pipeline_options",
           "sub_shard_options"]

#: The backends that run a crossdali DALI pipeline (the others are each framework's own loader).
DALI_BACKENDS = ("dali-gpu", "dali-cpu")
#: a classification loader's backends: DALI, the framework's own input pipeline, random tensors
CLASSIFICATION_BACKENDS = (*DALI_BACKENDS, "native", "synthetic")


@dataclass(frozen=True)
class PipelineOptions:
    """How a pipeline runs: where, how many threads, which shard, which seed.

    ``shard_id``/``num_shards`` must come from the GLOBAL rank and world size
    (``crossdali.common.distributed.detect_distributed``). ``seed`` fixes both the shuffle and
    the augmentation; each shard derives its augmentation seed from it so shards differ.
    ``hw_decoder_load`` is the share of JPEGs sent to the hardware JPEG decoder of GPUs that have one
    (``crossdali info`` says whether this GPU has one); the default 1.0 was the fastest share
    (docs/benchmarks.md#classification-loaders).
    ``checkpointing`` turns on DALI's pipeline checkpointing (reader position and random
    generators), which a loader's ``state_dict`` saves for a mid-epoch resume; ``checkpoint``
    is such a saved state to start from. It is on by default in every framework, because DALI's
    ``shuffle_after_epoch`` shuffles differently with it on (measured: the same first epoch, other
    orders from the second): with it on everywhere, every framework sees the same epochs.
    ``global_order``: train in one order of the whole dataset per epoch, whatever the number of shards,
    from where it says (``crossdali.common.loading.global_order``); ``None`` is DALI's sharded order.
    ``pad_last_batch=False``: the classification reader runs on across epoch boundaries (every batch
    full, as tf.data's ``repeat().batch()``) instead of padding a shard's last batch; for views that
    cannot drop padding rows where the batches are (TensorFlow's ``loader.dataset`` on a GPU).
    """

    batch_size: int = 256
    device: str = "cpu"
    device_id: int | None = None
    num_threads: int = 4
    seed: int = 0
    shard_id: int = 0
    num_shards: int = 1
    prefetch_queue_depth: int = 2
    hw_decoder_load: float = 1.0
    initial_fill: int = 1024
    checkpointing: bool = True
    checkpoint: bytes | None = None
    global_order: GlobalOrder | None = None
    pad_last_batch: bool = True

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {self.device!r}")
        if self.device == "gpu" and self.device_id is None:
            raise ValueError("device='gpu' needs device_id (the local GPU index, e.g. the local rank)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.num_threads < 1:
            raise ValueError(f"num_threads must be positive, got {self.num_threads}")
        if self.num_shards < 1 or not 0 <= self.shard_id < self.num_shards:
            raise ValueError(f"shard_id must be in [0, num_shards={self.num_shards}), got {self.shard_id}")
        if not 0.0 <= self.hw_decoder_load <= 1.0:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {self.hw_decoder_load}")
        if self.prefetch_queue_depth < 1:
            raise ValueError(f"prefetch_queue_depth must be positive, got {self.prefetch_queue_depth}")
        if self.checkpoint is not None and not self.checkpointing:
            raise ValueError("a checkpoint to restore needs checkpointing=True")

    @property
    def pipeline_device_id(self) -> int | None:
        """``device_id`` for ``Pipeline``: ``None`` in CPU mode, so no CUDA context is created."""
        return self.device_id if self.device == "gpu" else None

    @property
    def augmentation_seed(self) -> int:
        """The pipeline's seed: the run's seed, different on every shard (shards must not augment alike), and
        in the global order different for a pipeline that starts mid-run (a resume on another number of ranks
        draws new augmentations rather than replaying the first steps' ones)."""
        seed = self.seed + 1_000_003 * self.shard_id
        if self.global_order is not None and (self.global_order.epoch or self.global_order.start):
            seed = (seed + 7_919 * self.global_order.epoch + 104_729 * self.global_order.start) % 2**31
        return seed

    def pipeline_kwargs(self) -> dict:
        """The ``pipeline_def`` arguments every crossdali pipeline passes."""
        kwargs = dict(batch_size=self.batch_size, num_threads=self.num_threads, device_id=self.pipeline_device_id,
                      seed=self.augmentation_seed, prefetch_queue_depth=self.prefetch_queue_depth)
        if self.checkpointing:
            kwargs["enable_checkpointing"] = True
            if self.checkpoint is not None:
                kwargs["checkpoint"] = self.checkpoint
        return kwargs


def check_backend(backend: str, backends: tuple[str, ...], *, what: str = "data backend") -> None:
    """A ``ValueError`` naming the valid choices when ``backend`` is not one of ``backends``."""
    if backend not in backends:
        raise ValueError(f"{what} must be one of {', '.join(backends)}; got {backend!r}")


def pipeline_options(backend: str, *, batch_size: int, dist: DistInfo | None = None, device_id: int | None = None,
                     workers: int = 4, seed: int = 0, hw_decoder_load: float = 1.0,
                     checkpointing: bool = True, checkpoint: bytes | None = None,
                     prefetch_queue_depth: int = 2, global_order: GlobalOrder | None = None) -> PipelineOptions:
    """``PipelineOptions`` for a DALI backend: ``dali-gpu`` runs on ``device_id`` (default: the local
    rank's GPU), ``dali-cpu`` on the CPU with no CUDA context; shard = global rank; ``workers`` is
    DALI's CPU thread count (at least 1); ``prefetch_queue_depth`` the batches DALI prepares ahead."""
    check_backend(backend, DALI_BACKENDS)
    dist = dist or DistInfo()
    gpu = backend == "dali-gpu"
    return PipelineOptions(
        batch_size=batch_size, device="gpu" if gpu else "cpu",
        device_id=dist.gpu_id(device_id) if gpu else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size,
        hw_decoder_load=hw_decoder_load, checkpointing=checkpointing, checkpoint=checkpoint,
        prefetch_queue_depth=prefetch_queue_depth, global_order=global_order)


def sub_shard_options(options: PipelineOptions, pipelines: int) -> list[PipelineOptions]:
    """Options for ``pipelines`` pipelines that together read ``options``' shard, each its own part.

    Pipeline ``i`` of shard ``s`` (of ``n``) reads shard ``s * pipelines + i`` of ``n * pipelines``
    with ``batch_size / pipelines`` samples per step, so one step of all of them is one batch of
    ``batch_size`` and an epoch still reads every sample once. Several pipelines keep more hardware
    decoders busy than one (video: ``crossdali.common.video``); every pipeline has its own shard id,
    hence its own augmentation seed. ``pipelines=1`` returns ``[options]`` unchanged.
    """
    if pipelines < 1:
        raise ValueError(f"pipelines must be positive, got {pipelines}")
    if pipelines == 1:
        return [options]
    if options.batch_size % pipelines:
        raise ValueError(f"batch size {options.batch_size} does not split into {pipelines} pipelines: pick a "
                         f"batch size divisible by {pipelines}, or another number of pipelines")
    if options.checkpoint is not None:
        raise ValueError("a single DALI checkpoint cannot restore several pipelines: restore each pipeline's own")
    return [replace(options, batch_size=options.batch_size // pipelines, shard_id=options.shard_id * pipelines + i,
                    num_shards=options.num_shards * pipelines) for i in range(pipelines)]
