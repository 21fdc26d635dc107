"""``create_external_source_loader`` and ``create_multilabel_loader`` for MXNet: ``mx.io.DataIter``
batches from any Python source of encoded images (and from multi-label lists), through DALI's
``fn.external_source`` and crossdali's classification transform.

The source, its sharding, epochs, DALI's Python workers, the trim of a padded last batch and the
mid-epoch resume are framework-free (``crossdali.common.external``, ``...external_loader``), the
same as PyTorch's and JAX's. What is MXNet's: DALI has no MXNet plugin any more, so the pipeline's
outputs are taken from DALI's base iterator here (as ``crossdali.mxnet.loaders`` does for the file
readers), and batches follow MXNet's convention: always ``batch_size`` rows, the last one of an
epoch padded by repeating its last row and saying so in ``DataBatch.pad``. See
docs/external-source.md and docs/mxnet.md.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
from nvidia.dali.plugin.base_iterator import _DaliBaseIterator

from crossdali.common.classification import ClassificationTransform
from crossdali.common.distributed import DistInfo
from crossdali.common.external import ExternalSourceOptions, prepare_external_source
from crossdali.common.loading.dali_loader import DALIIteratorLoader
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.external_loader import ExternalLoaderMixin
from crossdali.mxnet.loaders import DATA_NAME, LABEL_NAME, _EpochIter, require_mxnet_gpu

__all__ = ["EXTERNAL_BACKENDS", "ExternalSourceIter", "ExternalSourceOptions", "create_external_source_loader",
           "create_multilabel_loader"]

EXTERNAL_BACKENDS = ("dali-gpu", "dali-cpu")


class _PipelineOutputs(_DaliBaseIterator):
    """DALI's base iterator with ``next()`` giving the pipeline's outputs as NDArrays by name.

    No reader and no size: the external source ends the epoch (``StopIteration``), and the base
    iterator then resets itself (``auto_reset``), as DALI's own plugins do for such pipelines.
    """

    def __init__(self, pipeline, names: tuple[str, ...], context: mx.Context) -> None:
        super().__init__([pipeline], reader_name=None, auto_reset=True, last_batch_policy=LastBatchPolicy.FILL,
                         prepare_first_batch=False)
        self.names, self.context = names, context
        # the dynamic executor never recycles an output buffer: DLPack without a copy (see loaders.py)
        self._copy = not pipeline.exec_dynamic

    def __next__(self) -> dict[str, mx.nd.NDArray]:
        self._ever_consumed = True
        outputs = self._get_outputs()[0]
        batch = {name: mx.nd.from_dlpack(out.as_tensor().__dlpack__(stream=None, copy=self._copy))
                 for name, out in zip(self.names, outputs)}
        self._schedule_runs()
        self._advance_and_check_drop_last()
        return batch


class _ExternalBatches(ExternalLoaderMixin, DALIIteratorLoader):
    """The loader contract over an external source with MXNet NDArrays: ``(images, labels)`` of the
    real rows only (what PyTorch's and JAX's loaders give); ``ExternalSourceIter`` adds MXNet's
    padding convention on top."""

    def __init__(self, ext, options, context: mx.Context) -> None:
        self.context = context
        super().__init__(ext, options)

    def _new_iterator(self, pipeline) -> _PipelineOutputs:
        return _PipelineOutputs(pipeline, self.names, self.context)

    def _outputs(self, raw: dict) -> dict:
        return raw

    def _flat(self, array: mx.nd.NDArray) -> mx.nd.NDArray:
        return array.reshape((-1,)).astype(np.float32)  # MXNet's iterators give labels as float32


class ExternalSourceIter(_EpochIter):
    """``mx.io.DataIter`` over an external source, with the reset and ``state_dict`` behaviour of
    every crossdali MXNet iterator (``crossdali.mxnet.loaders._EpochIter``).

    Batches: ``data=[images (batch_size, 3, H, W)]``, ``label=[labels (batch_size,) float32]`` (or
    ``(batch_size, num_classes)`` float32 multi-hot with ``multi_label``). An epoch's last batch is
    filled up to ``batch_size`` by repeating its last row, and ``DataBatch.pad`` counts those rows.
    ``state_dict`` carries the framework-free loader's state (DALI's checkpoint for an indexed
    source; the batches to skip for a stream), so a restored iterator continues its epoch.
    """

    def __init__(self, batches: _ExternalBatches, *, crop_size: int, dtype: str) -> None:
        super().__init__(batches.batch_size)
        self._loader, self._it = batches, None
        self.plan, self.num_classes = batches.plan, batches.num_classes
        self.context = batches.context
        label_shape = (self.batch_size, self.num_classes) if batches.ext.data.multi_label else (self.batch_size,)
        self._provide_data = [mx.io.DataDesc(DATA_NAME, (self.batch_size, 3, crop_size, crop_size), np.dtype(dtype),
                                             layout="NCHW")]
        self._provide_label = [mx.io.DataDesc(LABEL_NAME, label_shape, np.float32,
                                              layout="NC" if len(label_shape) == 2 else "N")]

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return self._provide_data

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return self._provide_label

    @property
    def num_samples(self) -> int:
        """Samples per epoch over all shards (0 for a stream of unknown length)."""
        return self._loader.ext.data.num_samples

    def __len__(self) -> int:
        """Batches per epoch on this rank (``TypeError`` for a stream of unknown length)."""
        return len(self._loader)

    def _pad(self, array: mx.nd.NDArray, rows: int) -> mx.nd.NDArray:
        if rows == 0:
            return array
        return mx.nd.concat(array, mx.nd.repeat(array[-1:], repeats=rows, axis=0), dim=0)

    def next(self) -> mx.io.DataBatch:
        self._dirty = True
        if self._it is None:
            self._it = iter(self._loader)
        try:
            images, labels = next(self._it)
        except StopIteration:
            self._end_epoch()
            raise
        self._batches += 1
        pad = self.batch_size - images.shape[0]
        return mx.io.DataBatch(data=[self._pad(images, pad)], label=[self._pad(labels, pad)], pad=pad,
                               provide_data=self._provide_data, provide_label=self._provide_label)

    def __next__(self) -> mx.io.DataBatch:
        return self.next()

    def reset(self) -> None:
        """Start the next epoch: at its end, or mid-way (the rest is read and discarded)."""
        if not self._dirty:
            return
        if not self._ended:
            for _ in self._it if self._it is not None else iter(self._loader):
                pass
            self._end_epoch()
        self._it = None
        self._reset_counters()

    def state_dict(self) -> dict:
        return super().state_dict() | {"loader": self._loader.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (what ``state_dict()`` returned, possibly through JSON)."""
        if "loader" not in state:
            raise ValueError(f"loader state {sorted(state)} lacks 'loader': pass what ExternalSourceIter.state_dict() "
                             "returned")
        self._loader.load_state_dict(state["loader"])
        self._load_counters(state)
        self._it = None


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
) -> ExternalSourceIter:
    """An ``mx.io.DataIter`` of a Python source of ``(encoded bytes, label)``: the arguments of
    ``crossdali.pytorch.create_external_source_loader``. Images are float NCHW on ``cpu()`` (or
    ``gpu(device_id)`` with ``dali-gpu`` and a CUDA build of MXNet); labels float32 ``(N,)``, or
    ``(N, num_classes)`` multi-hot with ``multi_label``. ``feed.py_start_method='auto'`` forks
    DALI's Python workers (MXNet's CPU wheel holds no CUDA context); ``spawn`` when MXNet has a GPU.

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
        workers: DALI's threads, or the native iterator's decoding threads (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        feed: DALI's Python workers, batched streams and stream sharding (``ExternalSourceOptions``).
        name: how logs and errors name the source.
        multi_label: each sample's label is a list of class indices, delivered as ``(N, num_classes)`` float32
            multi-hot.
    """
    feed = feed or ExternalSourceOptions()
    if feed.py_start_method == "auto":
        feed = replace(feed, py_start_method="spawn" if mx.context.num_gpus() > 0 else "fork")
    ext = prepare_external_source(source, train=train, backend=backend, backends=EXTERNAL_BACKENDS,
                                  batch_size=batch_size, num_samples=num_samples, num_classes=num_classes, dist=dist,
                                  last_batch=last_batch, feed=feed, seed=seed, name=name, multi_label=multi_label,
                                  transform=ClassificationTransform(crop_size=crop_size, dtype=dtype,
                                                                    output_layout="CHW"))
    require_mxnet_gpu(backend)
    options = ext.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, checkpointing=checkpointing)
    context = mx.gpu(options.device_id) if options.device == "gpu" else mx.cpu()
    return ExternalSourceIter(_ExternalBatches(ext, options, context), crop_size=crop_size, dtype=dtype)


def create_multilabel_loader(
    data,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 256,
    crop_size: int = 224,
    workers: int = 4,
    py_workers: int = 2,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    dtype: str = "float32",
    checkpointing: bool = True,
    exclude=None,
) -> ExternalSourceIter:
    """Batches of the train or val split of a multi-label list (``data``: a folder with
    ``train.txt``/``val.txt``, a list file, or a ``MultiLabelSource``): float NCHW images and
    ``(batch_size, classes)`` float32 multi-hot labels; the arguments of
    ``crossdali.pytorch.create_multilabel_loader``.

    Args:
        data: a folder with ``train.txt``/``val.txt`` (or ``.csv``), a list file, or a resolved
            ``MultiLabelSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads, or the native iterator's decoding threads (``native``).
        py_workers: DALI's Python worker processes reading the files (0: read in this process).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        exclude: an exclusion list (``crossdali check`` writes one) or sample ids to leave out.
    """
    from crossdali.common.multilabel import multilabel_loader_args  # defer: scikit-learn

    source, kwargs = multilabel_loader_args(Path(data) if isinstance(data, str) else data, train=train,
                                            py_workers=py_workers, exclude=exclude)
    return create_external_source_loader(
        source, train=train, backend=backend, batch_size=batch_size, crop_size=crop_size, workers=workers,
        seed=seed, dist=dist, device_id=device_id, dtype=dtype, checkpointing=checkpointing, **kwargs)
