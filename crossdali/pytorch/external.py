"""``create_external_source_loader``: (images, labels) torch batches from any Python source of
encoded images, through DALI's ``fn.external_source`` and crossdali's classification transform.

Everything about the source (indexed or stream, sharding, epochs, parallel workers, resuming,
the trim of a padded last batch) is framework-free in ``crossdali.common.external`` and
``crossdali.common.loading.external_loader``; this module only turns the pipeline's outputs into torch
tensors (DALI's PyTorch iterator, as ``DALILoader``). See docs/external-source.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from crossdali.common.classification import ClassificationTransform
from crossdali.common.distributed import DistInfo
from crossdali.common.external import ExternalSourceOptions, prepare_external_source
from crossdali.common.loading.external_loader import ExternalLoaderMixin
from crossdali.pytorch.loaders import DALILoader, require_cuda

__all__ = ["EXTERNAL_BACKENDS", "ExternalSourceLoader", "ExternalSourceOptions", "create_external_source_loader"]

EXTERNAL_BACKENDS = ("dali-gpu", "dali-cpu")


class ExternalSourceLoader(ExternalLoaderMixin, DALILoader):
    """``DALILoader`` over an external source, torch tensors out; epochs, trimming and resuming are
    ``crossdali.common.loading.external_loader.ExternalLoaderMixin``'s."""


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
    channels_last: bool = False,
) -> ExternalSourceLoader:
    """PyTorch ``(images, labels)`` batches (float NCHW, int64) from a Python source of
    ``(encoded bytes, label)``, decoded and augmented by DALI.

    Args:
        source: a dataset with ``len`` and ``[i]``, a function ``fn(i)`` (with ``num_samples``), an
            iterable (e.g. a Squirrel stream, ``crossdali.common.squirrel.SquirrelSource``) or a
            generator function.
        train: crossdali's train or val transform, and the epoch rule that goes with it.
        backend: ``dali-gpu`` or ``dali-cpu``.
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        num_samples: the dataset's length where ``source`` does not say it (a function, a stream).
        num_classes: the class count where the labels do not show it.
        workers: DALI's threads.
        seed: shuffle and augmentation seed.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` images.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: let ``state_dict()`` resume mid-epoch.
        feed: DALI's Python workers (``ExternalSourceOptions(parallel=True)``), batched streams and
            stream sharding (``py_start_method='auto'``: fork, or spawn once CUDA is initialised in
            this process).
        name: how logs and errors name the source (default: its own short repr or its type).
        multi_label: each sample's label is a list of class indices; labels come out as
            ``(N, num_classes)`` float32 multi-hot (``create_multilabel_loader`` reads list files).
        channels_last: the images in torch's channels-last memory format, as in
            ``crossdali.pytorch.create_classification_loader``.
    """
    feed = feed or ExternalSourceOptions()
    if feed.py_start_method == "auto":
        # fork copies the source for free but is unsafe once this process holds a CUDA context
        feed = replace(feed, py_start_method="spawn" if torch.cuda.is_initialized() else "fork")
    ext = prepare_external_source(source, train=train, backend=backend, backends=EXTERNAL_BACKENDS,
                                  batch_size=batch_size, num_samples=num_samples, num_classes=num_classes, dist=dist,
                                  last_batch=last_batch, feed=feed, seed=seed, name=name, multi_label=multi_label,
                                  transform=ClassificationTransform(crop_size=crop_size, dtype=dtype,
                                                                    output_layout="HWC" if channels_last else "CHW"))
    require_cuda(backend)
    options = ext.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    return ExternalSourceLoader(ext, options, channels_last=channels_last)
