"""Any Python source of encoded images + labels through ``fn.external_source``, with crossdali's
classification transform (``augment_classification``) and epoch rules.

User code produces ``(encoded image bytes, integer label)`` (or, with ``multi_label=True``, the
sample's class indices, delivered as a float32 multi-hot vector); DALI decodes and augments. Two
kinds of source, told apart by what they offer:

- **indexed** (random access: ``len(source)`` + ``source[i]``, or a callable ``fn(i)`` with
  ``num_samples``): read per sample by ``IndexedSamples``, a stateless function of DALI's
  ``SampleInfo``. So it runs in DALI's Python worker processes (``parallel=True``), shards by the
  global rank, reshuffles every epoch (the same permutation on every rank, as
  ``fn.readers.file(shuffle_after_epoch=True)``), keeps the epoch rule of
  ``crossdali.common.loading.epochs`` (every sample exactly once across shards; ``DROP`` for training on
  several ranks) and resumes mid-epoch from a DALI checkpoint (DALI restores the epoch and
  iteration it passes to a callable that takes ``SampleInfo``).
- **stream** (any other iterable, e.g. a Squirrel ``Composable``, or a generator function):
  read in order and batched by ``StreamBatches``, a generator function DALI calls once per epoch
  (``cycle="raise"``); with ``parallel=True`` the whole stream runs in one dedicated DALI worker
  (DALI cannot split an iterator's state). A stream that has ``shard(shard_id, num_shards)``
  (``crossdali.common.squirrel.SquirrelSource`` does) is asked for this rank's part; any other is
  strided (rank ``r`` keeps items ``r, r + world, ...`` of a stream every rank reads alike).
  Guaranteed: every item of this rank's part once per epoch, in order. Exactly-once across
  ranks holds when the parts are disjoint and cover the stream. Equal step counts per rank need
  ``num_samples`` (the whole stream's length): each rank then stops at the same batch and fails
  loudly if its part is shorter. DALI does not checkpoint iterables; ``StreamBatches(skip=...)``
  re-reads and skips the batches already consumed, so a deterministic stream resumes exactly.

- **sharded** (a store of shards, each read whole: ``shard_sizes`` + ``read_shard(i)``, e.g.
  ``crossdali.common.squirrel.SquirrelSource``): read per batch by ``ShardBatches``, a stateless
  function of DALI's ``BatchInfo``, so with ``parallel=True`` every DALI worker builds different
  batches (a stream has one worker). Each rank keeps the shards ``rank, rank + world, ...``;
  training reshuffles the shard order and the order inside each shard every epoch; equal step
  counts per rank (the shard sizes are known), exact mid-epoch resume from a DALI checkpoint.

Samples that are not an image DALI decodes (a GIF, an HTML error page) are refused with the
sample's index, not converted: a training set should be fixed once, not on every epoch.

The three readers live in ``crossdali.common.loading.external_readers``; this module picks one for a
source (``prepare_external_source``) and builds the DALI pipeline around it.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from crossdali.common.classification import ClassificationTransform, augment_classification
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.epochs import LastBatchPolicy, batches_per_epoch, choose_last_batch_policy, log_epoch_plan
from crossdali.common.loading.external_readers import (
    IndexedSamples,
    ShardBatches,
    StreamBatches,
    sharded_limit,
)
from crossdali.common.loading.loaders import SplitPlan
from crossdali.common.options import PipelineOptions, check_backend

__all__ = ["ExternalData", "ExternalSourceOptions", "ExternalPlan", "prepare_external_source", "PACKED_INPUT",
           "pack_sample", "create_packed_external_source_pipeline", "create_external_source_pipeline",
           "batches_in_epoch", "stream_checkpoint_warning_silenced"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExternalData:
    """A user's source as a split: what ``SplitPlan.source`` holds for an external source."""

    source: Any
    kind: str  # "indexed" | "stream" | "sharded"
    num_samples: int  # the whole dataset (all ranks); 0 when a stream's length is unknown
    num_classes: int
    name: str
    format: str = "external"
    multi_label: bool = False

    @property
    def root(self) -> str:  # what prepare_split-style log lines print
        return self.name


@dataclass(frozen=True)
class ExternalSourceOptions:
    """How a user's source is fed to DALI (the reading side; ``PipelineOptions`` is the DALI side).

    ``parallel``: run the source in ``py_workers`` DALI worker processes (an indexed source is
    split across them per sample; a stream runs in one dedicated worker). ``py_start_method``:
    ``fork`` (no pickling; only before a CUDA context exists in the process), ``spawn`` (the source
    must be picklable) or ``auto`` (the framework wrapper picks: spawn once CUDA is initialised).
    ``batched``: a stream yields whole batches, not samples. ``shard`` (streams): ``auto``
    (``source.shard`` if it has one, else stride), ``self``, ``stride`` or ``none`` (the stream
    already is this rank's part).
    """

    parallel: bool = False
    py_workers: int = 2
    py_start_method: str = "auto"
    batched: bool = False
    shard: str = "auto"

    def __post_init__(self) -> None:
        if self.py_start_method not in ("auto", "fork", "spawn"):
            raise ValueError(f"py_start_method must be 'auto', 'fork' or 'spawn', got {self.py_start_method!r}")
        if self.parallel and self.py_workers < 1:
            raise ValueError(f"py_workers must be positive with parallel=True, got {self.py_workers}")
        if self.shard not in ("auto", "stride", "self", "none"):
            raise ValueError(f"shard must be one of auto, stride, self, none; got {self.shard!r}")


def _describe(source: Any) -> str:
    """The source's own short repr when it has one (``SquirrelSource('/data/store', 12 shards)``), else its type."""
    if type(source).__repr__ is not object.__repr__ and not isinstance(source, (list, tuple, dict)):
        text = repr(source)
        if len(text) <= 100:
            return text
    return f"{type(source).__module__}.{type(source).__qualname__}"


@dataclass(frozen=True)
class ExternalPlan:
    """An external source resolved for this process: the split plan (epoch rule, shard) and how to
    build its pipeline. ``samples_in_epoch``: what this rank delivers per epoch (``None``: unknown)."""

    plan: SplitPlan
    data: ExternalData
    feed: ExternalSourceOptions
    shard_mode: str  # indexed: "global"; sharded: "store"; stream: "self" (source.shard) | "stride" | "none"
    seed: int
    transform: ClassificationTransform

    @property
    def kind(self) -> str:
        return self.data.kind

    @property
    def sized(self) -> bool:
        return self.data.num_samples > 0

    def _indexed(self, options: PipelineOptions, *, epoch_offset: int = 0) -> IndexedSamples:
        src = self.data.source
        get = src.__getitem__ if hasattr(src, "__getitem__") else src
        return IndexedSamples(get, num_samples=self.data.num_samples, num_classes=self.data.num_classes,
                              batch_size=self.plan.batch_size, shard_id=options.shard_id,
                              num_shards=options.num_shards, shuffle=self.plan.train, seed=self.seed,
                              policy=self.plan.policy, name=self.data.name, epoch_offset=epoch_offset,
                              multi_label=self.data.multi_label)

    def _stream(self, options: PipelineOptions, *, skip: int = 0) -> StreamBatches:
        src, world, rank = self.data.source, options.num_shards, options.shard_id
        stride = None
        if self.shard_mode == "self":
            src = src.shard(rank, world)
        elif self.shard_mode == "stride":
            stride = (rank, world)
        limit = None
        if self.sized:
            per_rank = self.data.num_samples // world
            limit = per_rank // self.plan.batch_size * self.plan.batch_size \
                if self.plan.policy == LastBatchPolicy.DROP else None
        return StreamBatches(src, batch_size=self.plan.batch_size, num_classes=self.data.num_classes,
                             name=self.data.name, batched=self.feed.batched, stride=stride, limit=limit, skip=skip,
                             multi_label=self.data.multi_label)

    def _sharded(self, options: PipelineOptions, *, epoch_offset: int = 0) -> ShardBatches:
        return ShardBatches(self.data.source, batch_size=self.plan.batch_size, num_classes=self.data.num_classes,
                            name=self.data.name, shard_id=options.shard_id, num_shards=options.num_shards,
                            shuffle=self.plan.train, seed=self.seed, policy=self.plan.policy,
                            epoch_offset=epoch_offset, multi_label=self.data.multi_label)

    def samples_in_epoch(self, options: PipelineOptions) -> int | None:
        """Samples this rank delivers per epoch: exact for indexed and sharded sources, ``None`` for streams."""
        if self.kind == "indexed":
            return self._indexed(options).samples_in_epoch
        if self.kind == "sharded":
            return sharded_limit(tuple(self.data.source.shard_sizes), batch_size=self.plan.batch_size,
                                 rank=options.shard_id, world=options.num_shards, policy=self.plan.policy)
        return None

    def padded_rows(self, options: PipelineOptions) -> list[int]:
        """Real rows of each batch of one epoch on this rank, the epoch padded to whole batches
        (what ``packed_samples`` delivers): every batch full but the last."""
        n, b = self.samples_in_epoch(options), self.plan.batch_size
        if n is None:
            raise ValueError(f"{self.data.name} is a stream: its epochs cannot be laid out in advance")
        return [min(b, n - start) for start in range(0, n, b)]

    def packed_samples(self, options: PipelineOptions, *, start_epoch: int = 0):
        """Endless generator of ``pack_sample`` arrays: epoch after epoch from ``start_epoch`` (each
        reshuffled as the DALI-fed loaders reshuffle it), every epoch padded to whole batches by
        repeating its last sample. For an input that DALI does not pull itself (TensorFlow's
        ``DALIDatasetWithInputs``); indexed and sharded sources only (a stream has no epoch layout)."""
        if self.kind == "indexed":
            read = self._indexed(options)
            for epoch in itertools.count(start_epoch):
                for idx in range(read.padded):
                    yield pack_sample(*read(_Position(epoch_idx=epoch, idx_in_epoch=idx)))
        elif self.kind == "sharded":
            read = self._sharded(options)
            for epoch in itertools.count(start_epoch):
                for b in itertools.count():
                    try:
                        encoded, labels = read(_Position(epoch_idx=epoch, iteration=b))
                    except StopIteration:
                        break
                    for k in range(self.plan.batch_size):
                        i = min(k, len(encoded) - 1)  # the last batch padded with its last sample
                        yield pack_sample(encoded[i], labels[i])
        else:
            raise ValueError(f"{self.data.name} is a stream: its epochs cannot be laid out in advance")

    def build(self, options: PipelineOptions, *, skip_batches: int = 0, epoch_offset: int = 0):
        """The pipeline (outputs ``images``, ``labels``) over this rank's part of the source.
        ``skip_batches``: a stream's batches already consumed in the first epoch (resume);
        ``epoch_offset``: epochs already done when DALI starts at epoch 0 (resume without checkpoint)."""
        if self.kind == "indexed":
            callback = self._indexed(options, epoch_offset=epoch_offset)
        elif self.kind == "sharded":
            callback = self._sharded(options, epoch_offset=epoch_offset)
        else:
            callback = self._stream(options, skip=skip_batches)
        return create_external_source_pipeline(
            callback, batch=self.kind != "indexed", batch_info=self.kind == "sharded", train=self.plan.train,
            options=options, transform=self.transform, parallel=self.feed.parallel,
            py_start_method=self.feed.py_start_method,
            py_workers=1 if self.kind == "stream" else self.feed.py_workers,  # a stream has one dedicated worker
            multi_label=self.data.multi_label)


def create_external_source_pipeline(callback, *, batch: bool, train: bool, options: PipelineOptions,
                                    transform: ClassificationTransform | None = None, parallel: bool = False,
                                    py_workers: int = 1, py_start_method: str = "fork", multi_label: bool = False,
                                    batch_info: bool = False):
    """Build (not start) a pipeline: ``fn.external_source(callback)`` -> crossdali's train or val
    transform. Loader factories build it through ``prepare_external_source``.

    Args:
        callback: an ``IndexedSamples`` (``batch=False``), a generator function of batches
            (``batch=True``), or with ``batch_info`` a ``ShardBatches`` (a function of DALI's
            ``BatchInfo``); ``crossdali.common.loading.external_readers`` has all three.
        batch: whether ``callback`` gives whole batches.
        train: crossdali's train transform, or its val transform.
        options: where and how the pipeline runs (device, threads, shard, seed, batch size).
        transform: the preset (default: ``ClassificationTransform()``).
        parallel: run ``callback`` in DALI's Python worker processes.
        py_workers: how many worker processes with ``parallel``.
        py_start_method: ``fork`` or ``spawn`` for the workers.
        multi_label: labels are float32 multi-hot vectors, not int64 class indices.
        batch_info: ``callback`` takes DALI's ``BatchInfo`` (a ``ShardBatches``).

    Returns:
        A ``nvidia.dali.Pipeline`` with outputs ``(images, labels)``.
    """
    from nvidia.dali import fn, pipeline_def, types  # defer: keeps `import crossdali.common` light

    kwargs = options.pipeline_kwargs()
    if parallel:
        kwargs.update(py_num_workers=py_workers, py_start_method=py_start_method)
    source_kwargs = {}
    if batch_info:
        source_kwargs["batch_info"] = True
    elif batch:
        source_kwargs["cycle"] = "raise"  # a generator function: one epoch per call
    if parallel:
        # per-batch callables hand each batch to one worker: as many batches ahead as there are workers
        depth = max(options.prefetch_queue_depth, py_workers) if batch_info else options.prefetch_queue_depth
        source_kwargs["prefetch_queue_depth"] = depth

    @pipeline_def(**kwargs)
    def external_pipeline():
        jpegs, labels = fn.external_source(
            source=callback, num_outputs=2, batch=batch, parallel=parallel,
            dtype=[types.UINT8, types.FLOAT if multi_label else types.INT64], ndim=[1, 1], **source_kwargs)
        images = augment_classification(jpegs, train=train, options=options, transform=transform)
        if options.device == "gpu":
            labels = labels.gpu()
        return images, labels

    return external_pipeline()


@dataclass(frozen=True)
class _Position:
    """What DALI's ``SampleInfo``/``BatchInfo`` tell the readers, for callers other than DALI."""

    epoch_idx: int
    idx_in_epoch: int = 0
    iteration: int = 0


#: The name of the one input of the packed pipeline (``create_packed_external_source_pipeline``).
PACKED_INPUT = "samples"


def pack_sample(data: np.ndarray, label: np.ndarray) -> np.ndarray:
    """One sample as one uint8 array: the label's bytes (int64, or float32 multi-hot), then the
    encoded image. For inputs that carry one tensor per sample (TensorFlow's
    ``DALIDatasetWithInputs`` takes no multi-output source); ``create_packed_external_source_pipeline``
    splits it again."""
    return np.concatenate([np.ascontiguousarray(label).view(np.uint8).reshape(-1), data])


def create_packed_external_source_pipeline(*, train: bool, options: PipelineOptions, num_classes: int,
                                           transform: ClassificationTransform | None = None,
                                           multi_label: bool = False):
    """Build (not start) the external-source pipeline over one named input (``PACKED_INPUT``) of
    ``pack_sample`` arrays: the label's bytes are cut off and reinterpreted, the image goes
    through crossdali's train or val transform (the graph ``create_external_source_pipeline`` runs)."""
    from nvidia.dali import fn, pipeline_def, types  # defer: keeps `import crossdali.common` light

    width, dtype, shape = (4 * num_classes, types.FLOAT, [num_classes]) if multi_label else (8, types.INT64, [1])

    @pipeline_def(**options.pipeline_kwargs())
    def packed_pipeline():
        packed = fn.external_source(name=PACKED_INPUT, dtype=types.UINT8, ndim=1)
        labels = fn.reinterpret(packed[0:width], dtype=dtype, shape=shape)
        images = augment_classification(packed[width:], train=train, options=options, transform=transform)
        if options.device == "gpu":
            labels = labels.gpu()
        return images, labels

    return packed_pipeline()


@contextlib.contextmanager
def stream_checkpoint_warning_silenced():
    """Around a pipeline's build: DALI warns that it does not save a stream's position when
    checkpointing is on; ``StreamBatches(skip=...)`` restores it instead, so the warning is noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Checkpointing enabled in a pipeline with external source")
        yield


def _classes(source: Any, num_classes: int | None) -> int:
    if num_classes is not None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be positive, got {num_classes}")
        return num_classes
    for attr in ("num_classes", "classes"):
        value = getattr(source, attr, None)
        if value is not None:
            return value if isinstance(value, int) else len(value)
    raise ValueError(f"num_classes is not known for {_describe(source)}: pass num_classes=N (labels are 0..N-1), "
                     "or give the source a num_classes or classes attribute")


def prepare_external_source(
    source: Any,
    *,
    train: bool,
    backend: str,
    backends: tuple[str, ...],
    batch_size: int,
    num_samples: int | None = None,
    num_classes: int | None = None,
    dist: DistInfo | None = None,
    last_batch: str | None = None,
    feed: ExternalSourceOptions | None = None,
    seed: int = 0,
    transform: ClassificationTransform | None = None,
    name: str | None = None,
    multi_label: bool = False,
) -> ExternalPlan:
    """The shared start of every external-source loader factory (see the module docstring).

    ``source``: an indexed source (``len`` + ``[i]``), a callable ``fn(i)`` with ``num_samples``,
    an iterable, or a generator function (no arguments). ``num_samples`` sizes a stream (all ranks
    together). ``feed``: parallel workers, batched stream, stream sharding. ``name`` names the
    source in logs and errors. ``multi_label``: a sample's label is a list of class indices
    (multi-hot float32 out of the pipeline).
    """
    check_backend(backend, backends)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    feed = feed or ExternalSourceOptions()
    if feed.py_start_method == "auto":
        feed = replace(feed, py_start_method="fork")
    batched, shard = feed.batched, feed.shard
    dist = dist or DistInfo()
    name = name or _describe(source)
    classes = _classes(source, num_classes)
    takes_index = callable(source) and not inspect.isgeneratorfunction(source) and _arity(source) >= 1
    if hasattr(source, "shard_sizes") and hasattr(source, "read_shard"):
        sizes = tuple(source.shard_sizes)
        kind, n = "sharded", sum(sizes)
        if num_samples is not None and num_samples != n:
            raise ValueError(f"num_samples={num_samples} but {name} holds {n} samples; leave num_samples out")
        if len(sizes) < dist.world_size:
            raise ValueError(f"{name} has {len(sizes)} shards, fewer than the {dist.world_size} ranks reading it; "
                             "write it with fewer samples per shard")
    elif hasattr(source, "__len__") and hasattr(source, "__getitem__") and not isinstance(source, (str, bytes)):
        kind, n = "indexed", len(source)
        if num_samples is not None and num_samples != n:
            raise ValueError(f"num_samples={num_samples} but len({name}) is {n}; leave num_samples out")
    elif takes_index:
        if num_samples is None:
            raise ValueError(f"{name} is a callable fn(i) -> (bytes, label): pass num_samples=N (i runs over 0..N-1)")
        kind, n = "indexed", num_samples
    elif callable(source) or hasattr(source, "__iter__"):
        kind, n = "stream", num_samples or 0
    else:
        raise TypeError(f"{name} is neither indexable (len + [i]), a callable fn(i), nor iterable; "
                        "give a dataset, a function of the sample index, or an iterable of (bytes, label)")
    if batched and kind != "stream":
        raise ValueError(f"batched=True is for streams that yield whole batches; an {kind} source gives samples")
    if kind == "indexed" and n < dist.world_size:
        raise ValueError(f"{name} has {n} samples, fewer than the {dist.world_size} ranks that share it")
    if kind == "indexed":
        shard_mode = "global"
    elif kind == "sharded":
        shard_mode = "store"
    elif shard == "auto":
        shard_mode = "self" if hasattr(source, "shard") else "stride"
    else:
        shard_mode = shard
    if shard_mode == "self" and not hasattr(source, "shard"):
        raise ValueError(f"shard='self' needs {name}.shard(shard_id, num_shards); use shard='stride' or 'none'")
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    if policy not in (LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP):
        raise ValueError(f"last_batch={policy.name.lower()!r} is not supported for external sources; use partial or drop")
    if kind == "stream" and policy == LastBatchPolicy.DROP and not n and dist.world_size > 1:
        log.warning("%s: a stream of unknown length on %d ranks: ranks may take different step counts; pass "
                    "num_samples (the stream's length) so each stops at the same batch", name, dist.world_size)
    data = ExternalData(source=source, kind=kind, num_samples=n, num_classes=classes, name=name,
                        multi_label=multi_label)
    plan = SplitPlan(source=data, split="train" if train else "val", train=train, backend=backend,
                     batch_size=batch_size, dist=dist, policy=policy, num_samples=n)
    if dist.is_main:
        what = f"external {plan.split} ({backend}, {kind} {name}{', parallel' if feed.parallel else ''})"
        if n:
            log_epoch_plan(what, n, batch_size=batch_size, num_shards=dist.world_size, policy=policy)
        else:
            log.info("%s: a stream of unknown length, %d shard(s) (%s), batch %d", what, dist.world_size,
                     shard_mode, batch_size)
    return ExternalPlan(plan=plan, data=data, feed=feed, shard_mode=shard_mode, seed=seed,
                        transform=transform or ClassificationTransform())


def _arity(fn: Callable) -> int:
    """Positional parameters ``fn`` takes (``__call__``'s for objects), 0 when it cannot be told."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 0
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in sig.parameters.values())


def batches_in_epoch(plan: ExternalPlan) -> int | None:
    """Batches per epoch on each rank, ``None`` for a stream of unknown length."""
    if not plan.sized:
        return None
    if plan.kind == "sharded":  # ranks hold whole store shards: this rank's own count
        dist = plan.plan.dist
        limit = sharded_limit(tuple(plan.data.source.shard_sizes), batch_size=plan.plan.batch_size, rank=dist.rank,
                              world=dist.world_size, policy=plan.plan.policy)
        return math.ceil(limit / plan.plan.batch_size)
    return batches_per_epoch(plan.data.num_samples, batch_size=plan.plan.batch_size,
                             num_shards=plan.plan.dist.world_size, policy=plan.plan.policy)

