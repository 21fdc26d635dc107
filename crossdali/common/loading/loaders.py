"""The loader contract every framework implements, and the preamble every loader factory shares.

A framework package (``crossdali.pytorch``, ``crossdali.tensorflow``, ``crossdali.mxnet``, ...)
exposes ``create_<task>_loader(data, *, train, backend, batch_size, ...)`` factories that return a
``Loader``. Each factory starts the same way, so it is written once here:

    plan = prepare_split(data, train=train, backend=backend, backends=BACKENDS,
                         resolve=resolve_source, batch_size=batch_size, dist=dist)
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id)
    pipe = create_classification_pipeline(plan.source, train=train, options=options)

``prepare_split`` checks the backend name, resolves and validates the data (a wrong path fails
here, before any pipeline is built), chooses the last-batch policy (``crossdali.common.loading.epochs``)
and logs the epoch plan once (rank 0). What differs per framework is only how a DALI pipeline's
outputs become that framework's tensors. See docs/architecture.md for adding a framework or a
pipeline.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from crossdali.common.distributed import DistInfo
from crossdali.common.errors import UsageError
from crossdali.common.loading.epochs import (
    LastBatchPolicy,
    batch_sizes,
    batches_per_epoch,
    choose_last_batch_policy,
    log_epoch_plan,
)
from crossdali.common.loading.global_order import GLOBAL_ORDER_FORMATS, GlobalOrder
from crossdali.common.options import DALI_BACKENDS, PipelineOptions, check_backend, pipeline_options

__all__ = ["Loader", "SplitPlan", "prepare_split", "encode_dali_checkpoint", "decode_dali_checkpoint"]


@runtime_checkable
class Loader(Protocol):
    """What every ``create_*_loader`` returns, whatever the framework.

    - ``for batch in loader`` is one epoch; the next ``for`` is the next epoch (a new order for
      train, the same samples for val). Batches are tuples of that framework's tensors.
    - ``len(loader)``: batches in the coming epoch (for DALI's PARTIAL policy with unequal
      shards an upper bound: a shard's padding-only last batch is skipped).
    - ``batch_size``, ``num_classes``: as configured / as found in the data.
    - ``state_dict()`` / ``load_state_dict(state)``: where the loader stands (epochs done, and
      for DALI loaders built with checkpointing the reader position and random state inside
      the epoch), as plain JSON-able values, so a training checkpoint can resume the data
      stream where it stopped. ``load_state_dict`` is called before the first iteration.
    """

    batch_size: int
    num_classes: int

    def __iter__(self) -> Iterator[tuple]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass(frozen=True)
class SplitPlan:
    """One split of a dataset, resolved and validated, with its epoch rule and this process's shard."""

    source: Any  # DataSource (classification, video) or DetectionSource
    split: str
    train: bool
    backend: str
    batch_size: int
    dist: DistInfo
    policy: LastBatchPolicy
    num_samples: int  # samples per epoch over all shards (clips for video)
    pipelines: int = 1  # DALI pipelines per shard, each a shard of its own (options.sub_shard_options)

    @property
    def batches_per_epoch(self) -> int:
        return batches_per_epoch(self.num_samples, batch_size=self.batch_size // self.pipelines,
                                 num_shards=self.dist.world_size * self.pipelines, policy=self.policy)

    @property
    def batch_sizes(self) -> list[int]:
        """This shard's batch sizes per epoch, as the DALI loaders yield them (one pipeline; what the
        synthetic loaders of every framework yield, to be their ceiling step for step)."""
        return batch_sizes(self.num_samples, batch_size=self.batch_size, shard_id=self.dist.rank,
                           num_shards=self.dist.world_size, policy=self.policy)

    @property
    def num_classes(self) -> int:
        return self.source.num_classes

    def pipeline_options(self, *, workers: int = 4, seed: int = 0, device_id: int | None = None,
                         hw_decoder_load: float = 1.0, checkpointing: bool = True,
                         checkpoint: bytes | None = None, prefetch_queue_depth: int = 2,
                         global_order: bool = False) -> PipelineOptions:
        """``PipelineOptions`` for this split's DALI backend (see ``crossdali.common.options.pipeline_options``).
        ``global_order``: train in the order of ``crossdali.common.loading.global_order`` (image files only),
        so that a mid-epoch checkpoint resumes on any number of ranks."""
        order = None
        if global_order:
            if not self.train:
                raise ValueError("global_order applies to the train split (val reads every sample once in order)")
            if self.source.format not in GLOBAL_ORDER_FORMATS:
                raise UsageError(f"--global-order reads image files one by one (ImageFolder or a file list); "
                                 f"{self.source.root} holds {self.source.format} records, which DALI reads by shard. "
                                 "Train on the image files, or leave out --global-order")
            order = GlobalOrder(drop_last=self.policy == LastBatchPolicy.DROP)
        return pipeline_options(self.backend, batch_size=self.batch_size, dist=self.dist, device_id=device_id,
                                workers=workers, seed=seed, hw_decoder_load=hw_decoder_load,
                                checkpointing=checkpointing, checkpoint=checkpoint,
                                prefetch_queue_depth=prefetch_queue_depth, global_order=order)


def prepare_split(
    data: Any,
    *,
    train: bool,
    backend: str,
    backends: tuple[str, ...],
    resolve: Callable[[Any, str], Any],
    batch_size: int,
    dist: DistInfo | None = None,
    last_batch: str | None = None,
    source_type: type | tuple[type, ...] | None = None,
    count: Callable[[Any], int] | None = None,
    policies: tuple[LastBatchPolicy, ...] = (LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP, LastBatchPolicy.FILL),
    what: str = "",
    pipelines: int = 1,
) -> SplitPlan:
    """The shared start of every loader factory.

    ``data`` is a dataset path or an already resolved source (an instance of ``source_type``);
    ``resolve(data, split)`` resolves a path. ``count(source)`` gives the samples per epoch when
    that is not ``source.num_samples`` (video: clips). ``policies`` are the last-batch policies
    the framework's wrapper supports. ``what`` names the task in the log line. ``pipelines``: DALI
    pipelines per shard, each reading its own part with ``batch_size / pipelines`` per step.
    """
    check_backend(backend, backends)
    if pipelines != 1 and backend not in DALI_BACKENDS:
        raise UsageError(f"pipelines={pipelines} (--pipelines) splits DALI pipelines, and the {backend!r} backend "
                         f"(--data-backend) has none: use {' or '.join(DALI_BACKENDS)}, or pipelines=1")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if pipelines < 1 or batch_size % pipelines:
        raise UsageError(f"pipelines={pipelines} (--pipelines) must be positive and divide the batch size "
                         f"{batch_size} (--batch-size): each pipeline gives batch_size / pipelines samples per step")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if source_type is not None and isinstance(data, source_type) else resolve(data, split)
    if backend not in (*DALI_BACKENDS, "synthetic") and str(getattr(source, "root", "")).startswith("s3://"):
        raise UsageError(f"the {backend!r} backend (--data-backend) reads local files, and {source.root} is in an object "
                         f"store, which DALI reads: use {' or '.join(DALI_BACKENDS)} (docs/object-stores.md)")
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    if policy not in policies:
        raise ValueError(f"last_batch={policy.name.lower()!r} is not supported here; use one of "
                         f"{', '.join(p.name.lower() for p in policies)}")
    num_samples = count(source) if count is not None else source.num_samples
    if dist.is_main:
        where = getattr(source, "annotations_file", None) or f"{getattr(source, 'format', 'data')} at {source.root}"
        log_epoch_plan(f"{what + ' ' if what else ''}{split} ({backend}, {where})", num_samples,
                       batch_size=batch_size, num_shards=dist.world_size, policy=policy, pipelines=pipelines)
    return SplitPlan(source=source, split=split, train=train, backend=backend, batch_size=batch_size, dist=dist,
                     policy=policy, num_samples=num_samples, pipelines=pipelines)


def encode_dali_checkpoint(checkpoint: bytes | str) -> str:
    """A DALI pipeline checkpoint (bytes from ``iterator.checkpoints()``) as ASCII text, so a loader's
    ``state_dict`` stays plain JSON-able values (and loads with ``torch.load(weights_only=True)``)."""
    raw = checkpoint.encode() if isinstance(checkpoint, str) else bytes(checkpoint)
    return base64.b64encode(raw).decode("ascii")


def decode_dali_checkpoint(text: str) -> bytes:
    """The checkpoint ``encode_dali_checkpoint`` wrote, for ``Pipeline(checkpoint=...)``."""
    return base64.b64decode(text.encode("ascii"), validate=True)
