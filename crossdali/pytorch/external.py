"""``create_external_source_loader``: (images, labels) torch batches from any Python source of
encoded images, through DALI's ``fn.external_source`` and crossdali's classification transform.

Everything about the source (indexed or stream, sharding, epochs, parallel workers, resuming) is
framework-free in ``crossdali.common.external``; this module only turns the pipeline's outputs
into torch tensors (DALI's PyTorch iterator, as ``DALILoader``) and trims an indexed source's
padded last batch. See docs/external-source.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from crossdali.common.classification import ClassificationTransform
from crossdali.common.distributed import DistInfo
from crossdali.common.external import (
    ExternalPlan,
    ExternalSourceOptions,
    batches_in_epoch,
    prepare_external_source,
    stream_checkpoint_warning_silenced,
)
from crossdali.common.loaders import decode_dali_checkpoint
from crossdali.common.options import PipelineOptions
from crossdali.common.sources import DataError
from crossdali.pytorch.loaders import DALILoader, require_cuda

__all__ = ["EXTERNAL_BACKENDS", "ExternalSourceLoader", "ExternalSourceOptions", "create_external_source_loader"]

log = logging.getLogger(__name__)

EXTERNAL_BACKENDS = ("dali-gpu", "dali-cpu")


def _explain(ext: ExternalPlan):
    def explain(error: Exception) -> Exception:
        message = str(error)
        if "decoder" not in message and "nvImageCodec" not in message:
            return error
        return DataError(f"an image from {ext.data.name} cannot be decoded (its bytes look like an image format DALI "
                         f"reads, so it is probably truncated or corrupt); DALI said: {message.strip()}")
    return explain


class ExternalSourceLoader(DALILoader):
    """``DALILoader`` over an external source: the loader contract (``crossdali.common.loaders.Loader``).

    ``len``: batches per epoch on this rank (an upper bound for PARTIAL); a stream of unknown
    length has none (``TypeError``: pass ``num_samples``). ``state_dict`` holds the epoch and the
    batches and samples consumed in it, plus DALI's checkpoint when built with checkpointing:
    an indexed source then resumes exactly (DALI restores the sample index it passes to the
    source, and the augmentation's random state); a stream is re-read from its start and the
    consumed batches skipped (exact for a stream that yields the same items each time).
    """

    def __init__(self, ext: ExternalPlan, options: PipelineOptions) -> None:
        self.ext = ext
        self._skip, self._offset, self._samples, self._batches = 0, 0, 0, 0
        self._limit = ext.samples_in_epoch(options)
        super().__init__(ext.plan, options,
                         lambda opts: ext.build(opts, skip_batches=self._skip, epoch_offset=self._offset),
                         names=("images", "labels"), reader_name=None, explain=_explain(ext))

    def _make_iterator(self, options: PipelineOptions):
        with stream_checkpoint_warning_silenced():
            return super()._make_iterator(options)

    def __len__(self) -> int:
        n = batches_in_epoch(self.ext)
        if n is None:
            raise TypeError(f"{self.ext.data.name} is a stream of unknown length: pass num_samples= to "
                            "create_external_source_loader for len(loader)")
        return n

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            try:
                batch = next(self._iter)[0]
            except StopIteration:
                break
            except RuntimeError as e:
                raise self._explain(e) from e
            labels = batch["labels"]  # (N, 1) int64, or (N, classes) multi-hot float32
            images, labels = batch["images"], labels if self.ext.data.multi_label else labels.view(-1)
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
        elif self.ext.kind == "indexed":
            self._offset = self.epoch  # DALI starts at its epoch 0: shift to the epoch we are at
            if self._samples:
                log.warning("loader state without a DALI checkpoint: the epoch counter is restored, but epoch %d "
                            "starts again from its first batch (build the loader with checkpointing=True)", self.epoch)
                self._samples, self._batches = 0, 0
        self._iter = self._make_iterator(self._options)


def create_external_source_loader(
    source: Any,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 256,
    crop_size: int = 224,
    num_samples: int | None = None,
    num_classes: int | None = None,
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    dtype: str = "float32",
    last_batch: str | None = None,
    checkpointing: bool = False,
    feed: ExternalSourceOptions | None = None,
    name: str | None = None,
    multi_label: bool = False,
) -> ExternalSourceLoader:
    """``(images, labels)`` batches (float NCHW, int64) from a Python source of ``(encoded bytes, label)``.

    ``source``: a dataset with ``len`` and ``[i]``, a function ``fn(i)`` (with ``num_samples``), an
    iterable (e.g. a Squirrel stream: ``crossdali.common.squirrel.SquirrelSource``) or a generator
    function. ``train`` picks crossdali's train or val transform and the epoch rule; ``dist``
    shards by the global rank (default: one process); ``workers`` is DALI's thread count;
    ``feed`` sets DALI's Python workers (``ExternalSourceOptions(parallel=True)``), batched
    streams and stream sharding (``py_start_method='auto'``: fork, or spawn once CUDA is
    initialised in this process). ``checkpointing`` lets ``state_dict()`` resume mid-epoch.
    ``multi_label``: each sample's label is a list of class indices; labels come out as
    ``(N, num_classes)`` float32 multi-hot (see ``create_multilabel_loader`` for list files).
    """
    feed = feed or ExternalSourceOptions()
    if feed.py_start_method == "auto":
        # fork copies the source for free but is unsafe once this process holds a CUDA context
        feed = replace(feed, py_start_method="spawn" if torch.cuda.is_initialized() else "fork")
    ext = prepare_external_source(source, train=train, backend=backend, backends=EXTERNAL_BACKENDS,
                                  batch_size=batch_size, num_samples=num_samples, num_classes=num_classes, dist=dist,
                                  last_batch=last_batch, feed=feed, seed=seed, name=name, multi_label=multi_label,
                                  transform=ClassificationTransform(crop_size=crop_size, dtype=dtype))
    require_cuda(backend)
    options = ext.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    return ExternalSourceLoader(ext, options)
