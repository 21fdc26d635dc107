"""The framework-neutral half of a DALI loader: epochs, padding-only batches, errors that name the
file, and ``state_dict`` with DALI's pipeline checkpoint (the ``Loader`` contract of
``crossdali.common.loaders``). A framework's loader subclasses it with the DALI iterator of its
plugin and how that iterator's outputs become a batch (DALI's own plugins share one base iterator
the same way). Nothing here imports a framework.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

from crossdali.common.loaders import SplitPlan, decode_dali_checkpoint, encode_dali_checkpoint
from crossdali.common.options import PipelineOptions

__all__ = ["DALIIteratorLoader"]

log = logging.getLogger(__name__)


class DALIIteratorLoader:
    """One DALI pipeline behind a framework iterator: ``for batch in loader`` is one epoch of tuples
    of the ``names`` outputs (those in ``flatten`` reshaped to (N,)); a shard's padding-only last
    batch is skipped; DALI's failures become errors naming the file (``explain``).

    Built with ``options.checkpointing`` (the default), ``state_dict()`` carries DALI's pipeline
    checkpoint (reader position, shuffle and augmentation state) as text, so a restored loader
    continues the epoch with exactly the batches the uninterrupted one would have given.

    Subclasses define ``_new_iterator(pipeline)`` (the plugin's iterator, with ``reader_name``,
    ``last_batch_policy`` and ``auto_reset=True``), ``_outputs(raw)`` (the dict of named outputs
    of one ``next()``) and ``_flat(array)``.
    """

    def __init__(self, plan: SplitPlan, options: PipelineOptions, build: Callable[[PipelineOptions], object], *,
                 names: tuple[str, ...], reader_name: str, explain: Callable[[Exception], Exception],
                 flatten: tuple[str, ...] = ("labels",)) -> None:
        self.plan, self.source, self.policy = plan, plan.source, plan.policy
        self.batch_size, self.num_classes = options.batch_size, plan.num_classes
        self.names, self.flatten, self.epoch = names, flatten, 0
        self.reader_name = reader_name
        self._options, self._build, self._explain = options, build, explain
        self._iter = self._make_iterator(options)

    # -- what a framework subclass provides --------------------------------------------------
    def _new_iterator(self, pipeline):
        raise NotImplementedError

    def _outputs(self, raw) -> dict:
        raise NotImplementedError

    def _flat(self, array):
        raise NotImplementedError

    # -- the contract ---------------------------------------------------------------------------
    def _make_iterator(self, options: PipelineOptions):
        try:
            return self._new_iterator(self._build(options))
        except RuntimeError as e:  # the iterator runs the first batch: a bad file fails here
            raise self._explain(e) from e

    @property
    def num_samples(self) -> int:
        """Samples per epoch over all shards (clips for video)."""
        return self.plan.num_samples

    def __len__(self) -> int:
        return self.plan.batches_per_epoch

    def __iter__(self) -> Iterator[tuple]:
        while True:
            try:  # next() on DALI's iterator, not iter(): iter() mid-epoch asks for a reset it refuses
                batch = self._outputs(next(self._iter))
            except StopIteration:
                break
            except RuntimeError as e:
                raise self._explain(e) from e
            if batch[self.names[0]].shape[0] == 0:
                continue  # a shard shorter than the longest one ends with an empty batch
            yield tuple(self._flat(batch[n]) if n in self.flatten else batch[n] for n in self.names)
        self.epoch += 1

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch}
        if self._options.checkpointing:
            state["dali"] = encode_dali_checkpoint(self._iter.checkpoints()[0])
        return state

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        if "dali" not in state:
            log.warning("loader state without a DALI checkpoint: epoch counter restored, but the data order "
                        "starts again as in a fresh run (build the loader with checkpointing=True)")
            return
        if not self._options.checkpointing:
            raise ValueError("this loader state holds a DALI checkpoint, but the loader was built without "
                             "checkpointing: pass checkpointing=True to the loader factory")
        self._options = replace(self._options, checkpoint=decode_dali_checkpoint(state["dali"]))
        self._iter = self._make_iterator(self._options)
