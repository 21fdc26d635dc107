"""The framework-neutral half of a DALI loader: epochs, padding-only batches, errors that name the
file, several pipelines per shard merged into one batch, and ``state_dict`` with DALI's pipeline
checkpoints (the ``Loader`` contract of ``crossdali.common.loading.loaders``). A framework's loader
subclasses it with the DALI iterator of its plugin and how that iterator's outputs become a batch
(DALI's own plugins share one base iterator the same way). Nothing here imports a framework.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

from crossdali.common.distributed import DistInfo, gpu_reason
from crossdali.common.errors import UsageError
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.global_order import GlobalOrder, rank_positions, resume_point
from crossdali.common.loading.loaders import SplitPlan, decode_dali_checkpoint, encode_dali_checkpoint
from crossdali.common.options import PipelineOptions, sub_shard_options

__all__ = ["DALIIteratorLoader"]

log = logging.getLogger(__name__)


def _cpu_run_gpu(dist: DistInfo) -> str:
    """The GPU a dali-cpu rank would use under dali-gpu, for the log; a CPU run does not fail over it."""
    try:
        gpu = dist.gpu_id()
    except UsageError as e:
        return f"none: {e}"
    return f"{gpu}: {gpu_reason(dist.local_rank, gpu)}"


class DALIIteratorLoader:
    """DALI pipelines behind a framework iterator: ``for batch in loader`` is one epoch of tuples
    of the ``names`` outputs (those in ``flatten`` reshaped to (N,)); a shard's padding-only last
    batch is skipped; DALI's failures become errors naming the file (``explain``).

    ``plan.pipelines`` > 1 splits this shard over that many pipelines (``sub_shard_options``), each
    behind its own iterator with its own ``reader_name`` bookkeeping; a step takes one batch from
    each and concatenates them. The iterators stay in step by construction: DALI's PARTIAL pads
    every shard to the longest one's batches, so they all end on the same step (``_next`` checks).

    Built with ``options.checkpointing`` (the default), ``state_dict()`` carries DALI's pipeline
    checkpoints (reader position, shuffle and augmentation state) as text, one per pipeline, so a
    restored loader continues the epoch with exactly the batches the uninterrupted one would have given.

    Subclasses define ``_new_iterator(pipeline)`` (the plugin's iterator, with ``reader_name``,
    ``last_batch_policy`` and ``auto_reset=True``), ``_outputs(raw)`` (the dict of named outputs
    of one ``next()``), ``_flat(array)`` and, for several pipelines, ``_concat(arrays)``.

    ``unfold`` > 1: each DALI sample holds that many samples (video's ``clips_per_read``), so every output
    arrives as ``(n, unfold, ...)`` and is handed out as ``(n * unfold, ...)`` (a reshape, no copy);
    ``batch_size`` and ``num_samples`` count the unfolded samples, ``plan`` counts DALI's.

    ``reader_kind`` names which DALI reader operator ``reader_name`` is where a loader may use one of
    several (video: ``"legacy"`` or ``"experimental"``, ``crossdali.common.data.videos.clip_reader``); it is
    saved with the checkpoints, since one operator's checkpoint cannot restore the other.

    Built with ``options.global_order`` (``crossdali.common.loading.global_order``), ``state_dict()`` also
    records where the epoch stands in the one order of every world size, and ``resume_from_ranks`` continues
    from the states of all ranks of a job of another size.
    """

    def __init__(self, plan: SplitPlan, options: PipelineOptions, build: Callable[[PipelineOptions], object], *,
                 names: tuple[str, ...], reader_name: str, explain: Callable[[Exception], Exception],
                 flatten: tuple[str, ...] = ("labels",), reader_kind: str | None = None, unfold: int = 1) -> None:
        self.plan, self.source, self.policy = plan, plan.source, plan.policy
        self.unfold = unfold
        self.batch_size, self.num_classes = options.batch_size * unfold, plan.num_classes
        self.names, self.flatten, self.epoch = names, flatten, 0
        self.reader_name, self.reader_kind = reader_name, reader_kind
        self._options, self._build, self._explain = options, build, explain
        self._pipeline_options = sub_shard_options(options, plan.pipelines)
        dist = plan.dist  # every rank's placement, for --debug: a multi-node job shows its shards and GPUs here
        log.debug("rank %d of %d (local rank %d): DALI shard %d of %d on %s", dist.rank, dist.world_size,
                  dist.local_rank, options.shard_id, options.num_shards,
                  f"GPU {options.device_id}: {gpu_reason(dist.local_rank, options.device_id)}"
                  if options.device == "gpu" else f"the CPU (dali-gpu would use GPU {_cpu_run_gpu(dist)})")
        self._batches = 0  # batches yielded in the epoch in progress
        self.order = options.global_order  # where the pipelines started in the global order (None: sharded)
        self._consumed = 0  # samples yielded in the epoch in progress (global order)
        if self.order is not None:
            if plan.pipelines != 1:
                raise UsageError(f"--global-order reads one pipeline per rank; drop --pipelines {plan.pipelines}")
            self.reader_name = None  # the files come from GlobalOrderFiles, not a DALI reader with epoch metadata
        self._iters = [self._make_iterator(o) for o in self._pipeline_options]

    # -- what a framework subclass provides --------------------------------------------------
    def _new_iterator(self, pipeline):
        raise NotImplementedError

    def _outputs(self, raw) -> dict:
        raise NotImplementedError

    def _flat(self, array):
        raise NotImplementedError

    def _concat(self, arrays: list):
        raise NotImplementedError(f"{type(self).__name__} reads one pipeline per shard")

    @property
    def _iterator_policy(self) -> LastBatchPolicy:
        """The last-batch policy to give DALI's iterator: ``self.policy``, except that DROP is counted
        here and the iterator runs PARTIAL. DALI 2.4's iterator under DROP leaves a shard's padded last
        batch in the pipeline whenever ``floor(samples / shards)`` is a multiple of the batch size and
        the shards are unequal (measured: 41 images, 2 ranks, batch 4: from the second epoch on every
        rank's first batch was one image four times, and later ones shifted, so images repeated and
        others went missing). PARTIAL reads each epoch to its end, so here DROP yields the first
        ``len(self)`` batches (all full) and reads the rest of the epoch without yielding it."""
        if self.order is not None:  # GlobalOrderFiles gives whole batches only under DROP
            return LastBatchPolicy.PARTIAL
        if self.policy == LastBatchPolicy.DROP and self.reader_name:
            return LastBatchPolicy.PARTIAL
        return self.policy

    # -- the contract ---------------------------------------------------------------------------
    def _make_iterator(self, options: PipelineOptions):
        try:
            return self._new_iterator(self._build(options))
        except RuntimeError as e:  # the iterator runs the first batch: a bad file fails here
            raise self._explain(e) from e

    @property
    def pipelines(self) -> int:
        """DALI pipelines reading this shard (each its own part of it)."""
        return len(self._iters)

    @property
    def num_samples(self) -> int:
        """Samples per epoch over all shards (clips for video)."""
        return self.plan.num_samples * self.unfold

    def __len__(self) -> int:
        return self.plan.batches_per_epoch

    def _next(self) -> dict | None:
        """The next step's named outputs (the pipelines' parts concatenated), or None at the epoch's end."""
        parts, ended = [], 0
        for it in self._iters:
            try:  # next() on DALI's iterator, not iter(): iter() mid-epoch asks for a reset it refuses
                parts.append(self._outputs(next(it)))
            except StopIteration:
                ended += 1
            except RuntimeError as e:
                raise self._explain(e) from e
        if ended:
            if parts:
                raise RuntimeError(f"{ended} of {len(self._iters)} pipelines ended their epoch before the others: "
                                   "their shard sizes disagree (a bug in crossdali, please report it)")
            return None
        if len(parts) == 1:
            return parts[0]
        return {n: self._concat([p[n] for p in parts]) for n in self.names}

    def __iter__(self) -> Iterator[tuple]:
        counted = self._iterator_policy != self.policy  # DROP, counted here (see _iterator_policy)
        while (batch := self._next()) is not None:
            if counted and self._batches >= len(self):
                continue  # the epoch's last, partial batch: read so the next epoch starts clean, not yielded
            if batch[self.names[0]].shape[0] == 0:
                continue  # a shard shorter than the longest one ends with an empty batch
            self._batches += 1
            self._consumed += batch[self.names[0]].shape[0]
            if self.unfold > 1:
                batch = {n: x.reshape((-1, *x.shape[2:])) for n, x in batch.items()}
            yield tuple(self._flat(batch[n]) if n in self.flatten else batch[n] for n in self.names)
        self.epoch += 1
        self._batches = self._consumed = 0

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "batches": self._batches}
        if self.order is not None:
            o = self._options
            state["global_order"] = {
                "epoch": self.epoch, "start": self.order.start if self.epoch == self.order.epoch else 0,
                "consumed": self._consumed, "rank": o.shard_id, "world": o.num_shards, "batch_size": o.batch_size,
                "drop_last": self.order.drop_last, "seed": o.seed, "num_samples": self.plan.num_samples,
                "pipeline_start": [self.order.epoch, self.order.start]}
        if self._options.checkpointing:
            saved = [encode_dali_checkpoint(it.checkpoints()[0]) for it in self._iters]
            state["dali"] = saved[0] if len(saved) == 1 else saved
            if self.reader_kind is not None:
                state["dali_reader"] = self.reader_kind
            if self.unfold > 1:
                state["unfold"] = self.unfold
        return state

    def _check_global_order(self, state: dict) -> dict:
        """The ``global_order`` part of a saved state, checked against this loader's data and seed."""
        saved = state.get("global_order")
        if self.order is None and saved is not None:
            raise UsageError("this loader state was saved in the global order (--global-order): resume with "
                             "--global-order (global_order=True)")
        if self.order is not None and saved is None:
            raise UsageError("this loader state was saved in DALI's sharded order: resume without --global-order "
                             "(global_order=False), on the same number of processes")
        if saved is not None:
            for key, mine in (("num_samples", self.plan.num_samples), ("seed", self._options.seed),
                              ("batch_size", self._options.batch_size)):
                if saved[key] != mine:
                    raise UsageError(f"this loader state was saved with {key}={saved[key]} and this loader has "
                                     f"{key}={mine}: the global order continues only on the same data, --seed and "
                                     "--batch-size (per process)")
        return saved

    def _rebuild(self, order: GlobalOrder, checkpoint: bytes | None) -> None:
        self.order = order
        self._pipeline_options = [replace(self._options, global_order=order, checkpoint=checkpoint)]
        self._iters = [self._make_iterator(o) for o in self._pipeline_options]

    def resume_from_ranks(self, states: list[dict]) -> int:
        """Continue the epoch that the loaders of a job of any number of ranks stood in, from all their
        ``state_dict()``s saved at one step (global order only): this rank reads its part of the positions
        they had not read. Returns the steps of that epoch counted as done on this job's scale (``len(self)``
        minus the batches rank 0 has left), for a training loop's step counter and schedule."""
        if self.order is None:
            raise UsageError("a loader state resumes on another number of processes only in the global order: "
                             "save and resume with --global-order")
        saved = [self._check_global_order(s) for s in states]
        epoch, position = resume_point(states, num_samples=self.plan.num_samples)
        self._rebuild(GlobalOrder(drop_last=self.order.drop_last, epoch=epoch, start=position), None)
        self.epoch, self._consumed = epoch, 0
        left = len(rank_positions(self.plan.num_samples, start=position, rank=0, world=self._options.num_shards,
                                  batch_size=self._options.batch_size, drop_last=self.order.drop_last))
        self._batches = max(0, len(self) - -(-left // self._options.batch_size))
        log.info("data: epoch %d continues at sample %d of %d of its order (saved by %d process(es), read now by %d)",
                 epoch + 1, position, self.plan.num_samples, saved[0]["world"], self._options.num_shards)
        return self._batches

    def load_state_dict(self, state: dict) -> None:
        saved = self._check_global_order(state)
        if saved is not None:
            if (saved["world"], saved["rank"]) != (self._options.num_shards, self._options.shard_id):
                raise UsageError(f"this loader state is rank {saved['rank']}'s of {saved['world']}; this loader is rank "
                                 f"{self._options.shard_id} of {self._options.num_shards}: pass the states of all ranks "
                                 "to resume_from_ranks")
            if "dali" in state and self._options.checkpointing:  # DALI's checkpoint: augmentations too
                self._rebuild(GlobalOrder(self.order.drop_last, *saved["pipeline_start"]),
                              decode_dali_checkpoint(state["dali"]))
                self.epoch, self._batches, self._consumed = int(state["epoch"]), int(state["batches"]), saved["consumed"]
            else:
                self.resume_from_ranks([state])
            return
        self.epoch, self._batches = int(state["epoch"]), int(state.get("batches", 0))
        if "dali" not in state:
            log.warning("loader state without a DALI checkpoint: epoch counter restored, but the data order "
                        "starts again as in a fresh run (build the loader with checkpointing=True)")
            self._batches = 0
            return
        if not self._options.checkpointing:
            raise ValueError("this loader state holds a DALI checkpoint, but the loader was built without "
                             "checkpointing: pass checkpointing=True to the loader factory")
        if "batches" not in state and self._iterator_policy != self.policy:
            # saved before DROP was counted here: its DALI checkpoint carries DALI's DROP epoch size,
            # which would keep repeating samples in every later epoch (see _iterator_policy)
            log.warning("loader state from a crossdali older than its DROP fix: its DALI checkpoint would repeat "
                        "samples in every later epoch, so epoch %d starts again from its first batch, in a fresh "
                        "run's order", self.epoch)
            self._batches = 0
            return
        saved_kind = state.get("dali_reader")  # None: saved before crossdali recorded it, or no choice of reader
        if saved_kind is not None and self.reader_kind is not None and saved_kind != self.reader_kind:
            log.warning("loader state saved by DALI's %s reader, but this loader reads with the %s one (another "
                        "backend or other codecs: crossdali.common.data.videos.clip_reader), which cannot restore its "
                        "checkpoint: epoch %d starts again from its first batch, in a fresh run's order",
                        saved_kind, self.reader_kind, self.epoch)
            self._batches = 0
            return
        saved_unfold = int(state.get("unfold", 1))
        if saved_unfold != self.unfold:  # DALI's checkpoint counts reads of that many clips
            raise UsageError(f"this loader state was saved reading {saved_unfold} clip(s) at a time, but the loader "
                             f"reads {self.unfold}: build it with clips_per_read={saved_unfold} "
                             f"(--clips-per-read {saved_unfold}) to resume")
        saved = state["dali"] if isinstance(state["dali"], list) else [state["dali"]]
        if len(saved) != len(self._iters):
            raise UsageError(f"this loader state holds the checkpoints of {len(saved)} DALI pipeline(s) per shard, "
                             f"but the loader has {len(self._iters)}: build it with pipelines={len(saved)} "
                             f"(--pipelines {len(saved)}) to resume")
        self._pipeline_options = [replace(o, checkpoint=decode_dali_checkpoint(c))
                                  for o, c in zip(self._pipeline_options, saved, strict=True)]
        self._iters = [self._make_iterator(o) for o in self._pipeline_options]
