"""The framework-neutral half of the external-source loader: epochs, the trim of an indexed
source's padded last batch, and ``state_dict`` / ``load_state_dict`` (DALI's checkpoint for an
indexed source, batches to skip for a stream). A framework's ``ExternalSourceLoader`` puts
:class:`ExternalLoaderMixin` in front of its ``DALILoader`` (``crossdali.common.loading.dali_loader``), whose
``_outputs`` and ``_flat`` turn the iterator's outputs into that framework's arrays. Nothing here
imports a framework.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

from crossdali.common.errors import DataError
from crossdali.common.external import ExternalPlan, batches_in_epoch, stream_checkpoint_warning_silenced
from crossdali.common.loading.loaders import decode_dali_checkpoint
from crossdali.common.options import PipelineOptions

__all__ = ["ExternalLoaderMixin", "explain_external"]

log = logging.getLogger(__name__)


def explain_external(ext: ExternalPlan):
    """DALI's decoder failure on a sample of ``ext`` as a ``DataError`` naming the source."""
    def explain(error: Exception) -> Exception:
        message = str(error)
        if "decoder" not in message and "nvImageCodec" not in message:
            return error
        return DataError(f"an image from {ext.data.name} cannot be decoded (its bytes look like an image format DALI "
                         f"reads, so it is probably truncated or corrupt); DALI said: {message.strip()}")
    return explain


class ExternalLoaderMixin:
    """The loader contract (``crossdali.common.loading.loaders.Loader``) over an external source.

    ``len``: batches per epoch on this rank (an upper bound for PARTIAL); a stream of unknown
    length has none (``TypeError``: pass ``num_samples``). ``state_dict`` holds the epoch and the
    batches and samples consumed in it, plus DALI's checkpoint when built with checkpointing:
    an indexed source then resumes exactly (DALI restores the sample index it passes to the
    source, and the augmentation's random state); a stream is re-read from its start and the
    consumed batches skipped (exact for a stream that yields the same items each time).
    """

    def __init__(self, ext: ExternalPlan, options: PipelineOptions, **loader_options) -> None:
        """``loader_options``: what the framework's ``DALILoader`` takes besides (PyTorch: ``channels_last``)."""
        self.ext = ext
        self._skip, self._offset, self._samples, self._batches = 0, 0, 0, 0
        self._limit = ext.samples_in_epoch(options)
        super().__init__(ext.plan, options,
                         lambda opts: ext.build(opts, skip_batches=self._skip, epoch_offset=self._offset),
                         names=("images", "labels"), reader_name=None, explain=explain_external(ext), **loader_options)

    def _make_iterator(self, options: PipelineOptions):
        with stream_checkpoint_warning_silenced():
            return super()._make_iterator(options)

    def __len__(self) -> int:
        n = batches_in_epoch(self.ext)
        if n is None:
            raise TypeError(f"{self.ext.data.name} is a stream of unknown length: pass num_samples= to "
                            "create_external_source_loader for len(loader)")
        return n

    def __iter__(self) -> Iterator[tuple]:
        while True:
            try:
                batch = self._outputs(next(self._iters[0]))  # one pipeline: the source feeds one
            except StopIteration:
                break
            except RuntimeError as e:
                raise self._explain(e) from e
            labels = batch["labels"]  # (N, 1) integer, or (N, classes) multi-hot float32
            images, labels = batch["images"], labels if self.ext.data.multi_label else self._flat(labels)
            if self._limit is not None:  # an indexed source pads its shard's last batch: trim it
                keep = min(images.shape[0], self._limit - self._samples)
                if keep <= 0:
                    continue
                images, labels = images[:keep], labels[:keep]
            if images.shape[0] == 0:
                continue
            self._samples += images.shape[0]
            self._batches += 1
            yield images, labels
        self.epoch += 1
        self._samples, self._batches = 0, 0

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(batches=self._batches, samples=self._samples, epoch_offset=self._offset)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self._samples, self._batches = int(state.get("samples", 0)), int(state.get("batches", 0))
        if self.ext.kind == "stream":
            self._skip = self._batches
        if "dali" in state:
            if not self._options.checkpointing:
                raise ValueError("this loader state holds a DALI checkpoint, but the loader was built without "
                                 "checkpointing: pass checkpointing=True to the loader factory")
            self._offset = int(state.get("epoch_offset", 0))  # DALI restores its own epoch index
            self._options = replace(self._options, checkpoint=decode_dali_checkpoint(state["dali"]))
        elif self.ext.kind != "stream":  # indexed or sharded: a function of DALI's epoch index
            self._offset = self.epoch  # DALI starts at its epoch 0: shift to the epoch we are at
            if self._samples:
                log.warning("loader state without a DALI checkpoint: the epoch counter is restored, but epoch %d "
                            "starts again from its first batch (build the loader with checkpointing=True)", self.epoch)
                self._samples, self._batches = 0, 0
        self._iters = [self._make_iterator(self._options)]
