"""``create_external_source_loader``: (images, labels) ``jax.Array`` batches from any Python source
of encoded images, through DALI's ``fn.external_source`` and crossdali's classification transform.

The same source, epochs, sharding, parallel workers and resuming as ``crossdali.pytorch``'s
(``crossdali.common.external`` and ``crossdali.common.loading.external_loader``); this module only picks
DALI's JAX iterator. See docs/external-source.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nvidia.dali.plugin.jax import DALIGenericIterator

from crossdali.common.classification import ClassificationTransform
from crossdali.common.distributed import DistInfo
from crossdali.common.external import ExternalSourceOptions, prepare_external_source
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.external_loader import ExternalLoaderMixin
from crossdali.jax.loaders import DALILoader, require_gpu

__all__ = ["EXTERNAL_BACKENDS", "ExternalSourceLoader", "ExternalSourceOptions", "create_external_source_loader"]

EXTERNAL_BACKENDS = ("dali-gpu", "dali-cpu")


class ExternalSourceLoader(ExternalLoaderMixin, DALILoader):
    """``DALILoader`` over an external source, ``jax.Array`` out; epochs, trimming and resuming are
    ``crossdali.common.loading.external_loader.ExternalLoaderMixin``'s."""

    def _new_iterator(self, pipeline) -> DALIGenericIterator:
        # No reader: the source ends the epoch (StopIteration) and ExternalLoaderMixin trims an
        # indexed source's padding, so DALI's iterator only has to pass each batch on as it comes
        # (its PARTIAL policy, which the JAX iterator refuses, is never needed).
        return DALIGenericIterator([pipeline], list(self.names), last_batch_policy=LastBatchPolicy.FILL,
                                   auto_reset=True)


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
    layout: str = "HWC",
    last_batch: str | None = None,
    checkpointing: bool = False,
    feed: ExternalSourceOptions | None = None,
    name: str | None = None,
    multi_label: bool = False,
) -> ExternalSourceLoader:
    """``(images, labels)`` batches from a Python source of ``(encoded bytes, label)``: the arguments
    of ``crossdali.pytorch.create_external_source_loader``, plus ``layout`` (``"HWC"``, flax's NHWC,
    the default, or ``"CHW"``). Labels are int32 class indices (int64 under ``jax_enable_x64``), or
    ``(N, num_classes)`` float32 multi-hot with ``multi_label``. ``feed.py_start_method='auto'``
    spawns DALI's Python workers (so the source must pickle): JAX runs threads of its own from import
    on and warns that a fork may deadlock; ``'fork'`` is there for sources that cannot pickle.

    Args:
        source: a dataset with ``len`` and ``[i]``, a function ``fn(i)`` (with ``num_samples``), an iterable
            or a generator function of ``(encoded bytes, label)`` items.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        num_samples: the dataset's length where ``source`` does not say it (a function, a stream).
        num_classes: the class count where the labels do not show it.
        workers: DALI's threads.
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        layout: ``HWC`` or ``CHW`` images.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        feed: DALI's Python workers, batched streams and stream sharding (``ExternalSourceOptions``).
        name: how logs and errors name the source.
        multi_label: each sample's label is a list of class indices, delivered as ``(N, num_classes)`` float32
            multi-hot.
    """
    feed = feed or ExternalSourceOptions()
    if feed.py_start_method == "auto":
        feed = replace(feed, py_start_method="spawn")
    ext = prepare_external_source(source, train=train, backend=backend, backends=EXTERNAL_BACKENDS,
                                  batch_size=batch_size, num_samples=num_samples, num_classes=num_classes, dist=dist,
                                  last_batch=last_batch, feed=feed, seed=seed, name=name, multi_label=multi_label,
                                  transform=ClassificationTransform(crop_size=crop_size, dtype=dtype,
                                                                    output_layout=layout))
    require_gpu(backend)
    options = ext.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    return ExternalSourceLoader(ext, options)
