"""``create_external_source_loader`` and ``create_multilabel_loader`` for TensorFlow: batches from
any indexed or sharded Python source of encoded images (and from multi-label lists), through DALI's
TensorFlow plugin and crossdali's classification transform.

DALI's TensorFlow plugin cannot call a Python source the way the other loaders do
(``DALIDataset`` takes none; ``experimental.DALIDatasetWithInputs`` takes no multi-output source, no
``cycle="raise"`` and no DALI worker processes: docs/external-source.md). So the source is fed as
one named input: ``crossdali.common.external.ExternalPlan.packed_samples`` produces every sample as
one uint8 array (label bytes, then the encoded image), endlessly, epoch after epoch in the order
and shards of the other frameworks' loaders, each epoch padded to whole batches; DALI splits it
again (``create_packed_external_source_pipeline``) and runs the same transform. The epoch
bookkeeping (padding rows cut, ``len``, ``dataset`` for ``model.fit``, epoch-level ``state_dict``)
is ``crossdali.tensorflow.dali_loader.DALILoader``'s, as for the file readers. Streams (no length, no
epoch layout) are refused. The source runs in TensorFlow's ``from_generator`` thread: one Python
thread reads the samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from crossdali.common.classification import ClassificationTransform
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.external import (
    PACKED_INPUT,
    ExternalPlan,
    ExternalSourceOptions,
    create_packed_external_source_pipeline,
    prepare_external_source,
)
from crossdali.common.loading.external_loader import explain_external
from crossdali.common.options import PipelineOptions
from crossdali.tensorflow.dali_loader import NO_DALI_CHECKPOINTS, DALILoader, EpochPlan, pipeline_run_kwargs
from crossdali.tensorflow.devices import tf_device
from crossdali.tensorflow.loaders import _image_shape

__all__ = ["EXTERNAL_BACKENDS", "ExternalSourceLoader", "create_external_source_loader", "create_multilabel_loader"]

EXTERNAL_BACKENDS = ("dali-gpu", "dali-cpu")


def _explain(ext: ExternalPlan):
    """A failure inside the input generator (a ``DataError`` naming the sample) or in DALI's decoder
    as a ``DataError`` naming the source; TensorFlow wraps both in an ``OpError``."""
    decoder = explain_external(ext)

    def explain(error: Exception) -> Exception:
        message = getattr(error, "message", None) or str(error)
        if "DataError: " in message:
            return DataError(message.split("DataError: ", 1)[1].split("\n", 1)[0].strip())
        return decoder(error)
    return explain


class ExternalSourceLoader(DALILoader):
    """``DALILoader`` over an indexed or sharded Python source: DALI's TensorFlow plugin with the
    source as its one input (``DALIDatasetWithInputs``), the epoch layout known in advance."""

    def __init__(self, ext: ExternalPlan, options: PipelineOptions, *, output_shapes, output_dtypes) -> None:
        self.ext, self._options = ext, options
        names_flatten = () if ext.data.multi_label else ("labels",)
        super().__init__(ext.plan, options, self._build, names=("images", "labels"), output_shapes=output_shapes,
                         output_dtypes=output_dtypes, reader_name="", explain=_explain(ext), flatten=names_flatten)

    def _build(self, options: PipelineOptions):
        return create_packed_external_source_pipeline(train=self.ext.plan.train, options=options,
                                                      num_classes=self.ext.data.num_classes,
                                                      transform=self.ext.transform,
                                                      multi_label=self.ext.data.multi_label)

    def _epoch_plan(self, build, options, shapes, dtypes, *, twin_on_cpu: bool, reader_name: str) -> EpochPlan:
        rows = self.ext.padded_rows(options)
        return EpochPlan(valid=np.array([rows], dtype=np.int64), batch_size=self.batch_size,
                         epoch_size=self.ext.data.num_samples)

    def _raw_dataset(self, build, options: PipelineOptions, shapes, dtypes, *, host_outputs: bool) -> tf.data.Dataset:
        import nvidia.dali.plugin.tf as dali_tf  # defer: the plugin loads a compiled TF op library
        from nvidia.dali.plugin.tf.experimental import Input

        def samples():  # called by every iter(): a restored loader starts at its epoch, in that epoch's order
            return self.ext.packed_samples(options, start_epoch=self._epoch0)

        pipeline = build(options)
        device = tf_device(options.pipeline_device_id)
        with tf.device("/cpu:0"):
            inputs = tf.data.Dataset.from_generator(samples, output_signature=tf.TensorSpec([None], tf.uint8))
        if options.device == "gpu":  # the input must sit where the dataset runs (the plugin's docstring)
            inputs = inputs.apply(tf.data.experimental.copy_to_device(device))
        with tf.device(device):
            return dali_tf.experimental.DALIDatasetWithInputs(
                pipeline=pipeline, input_datasets={PACKED_INPUT: Input(inputs, batch=False)},
                batch_size=self.batch_size, output_shapes=shapes, output_dtypes=dtypes,
                device_id=options.pipeline_device_id, **pipeline_run_kwargs(pipeline))


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
    name: str | None = None,
    multi_label: bool = False,
) -> ExternalSourceLoader:
    """``(images, labels)`` TF batches from a Python source of ``(encoded bytes, label)``: the
    arguments of ``crossdali.pytorch.create_external_source_loader`` but ``feed`` (no DALI worker
    processes here), plus ``layout`` (``"HWC"``, Keras' default, or ``"CHW"``). ``source``: a
    dataset with ``len`` and ``[i]``, a function ``fn(i)`` with ``num_samples``, or a sharded
    source (``crossdali.common.squirrel.SquirrelSource``); a stream is refused. Labels are (N,)
    int64, or ``(N, num_classes)`` float32 multi-hot with ``multi_label``. ``checkpointing`` must
    stay off (epoch-level ``state_dict``, as every TensorFlow DALI loader).

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
        workers: DALI's threads, or tf.data's parallel calls (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        layout: ``HWC`` or ``CHW`` images.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: must stay off: ``DALIDataset`` cannot restore a DALI checkpoint, so ``state_dict`` is
            epoch-level.
        name: how logs and errors name the source.
        multi_label: each sample's label is a list of class indices, delivered as ``(N, num_classes)`` float32
            multi-hot.
    """
    if checkpointing:
        raise ValueError(NO_DALI_CHECKPOINTS)
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype, output_layout=layout)
    ext = prepare_external_source(source, train=train, backend=backend, backends=EXTERNAL_BACKENDS,
                                  batch_size=batch_size, num_samples=num_samples, num_classes=num_classes, dist=dist,
                                  last_batch=last_batch, feed=ExternalSourceOptions(), seed=seed, name=name,
                                  multi_label=multi_label, transform=transform)
    if ext.kind == "stream":
        raise ValueError(f"{ext.data.name} is a stream; TensorFlow's DALI plugin needs the epoch laid out in advance: "
                         "give an indexed source (len + [i], or fn(i) with num_samples) or a sharded one "
                         "(shard_sizes + read_shard, e.g. SquirrelSource)")
    options = ext.plan.pipeline_options(workers=workers, seed=seed, device_id=device_id)
    label_shape = (batch_size, ext.data.num_classes) if multi_label else (batch_size, 1)
    return ExternalSourceLoader(ext, options, output_shapes=((batch_size, *_image_shape(transform)), label_shape),
                                output_dtypes=(tf.float16 if dtype == "float16" else tf.float32,
                                               tf.float32 if multi_label else tf.int64))


def create_multilabel_loader(
    data,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 256,
    crop_size: int = 224,
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    dtype: str = "float32",
    layout: str = "HWC",
    exclude=None,
) -> ExternalSourceLoader:
    """``(images, labels)`` for the train or val split of a multi-label list (``data``: a folder with
    ``train.txt``/``val.txt``, a list file, or a ``MultiLabelSource``): float images and
    ``(N, classes)`` float32 multi-hot labels; the arguments of
    ``crossdali.pytorch.create_multilabel_loader`` but ``py_workers`` and ``checkpointing``.

    Args:
        data: a folder with ``train.txt``/``val.txt`` (or ``.csv``), a list file, or a resolved
            ``MultiLabelSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads, or tf.data's parallel calls (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        dtype: ``float32`` or ``float16`` outputs.
        layout: ``HWC`` or ``CHW`` images.
        exclude: an exclusion list (``crossdali check`` writes one) or sample ids to leave out.
    """
    from crossdali.common.multilabel import multilabel_loader_args  # defer: scikit-learn

    source, kwargs = multilabel_loader_args(Path(data) if isinstance(data, str) else data, train=train, py_workers=0,
                                            exclude=exclude)
    kwargs.pop("feed")
    return create_external_source_loader(source, train=train, backend=backend, batch_size=batch_size,
                                         crop_size=crop_size, workers=workers, seed=seed, dist=dist,
                                         device_id=device_id, dtype=dtype, layout=layout, **kwargs)
