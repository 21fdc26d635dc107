"""``create_classification_loader``: (images, labels) TensorFlow batches from any backend, and the
native and synthetic loader classes.

Backends, chosen by name (DeepLearningExamples' ``--data-backend``):

- ``dali-gpu``: the shared DALI pipeline (``crossdali.common.classification``) with the mixed
  (GPU / hardware JPEG) decoder, in ``nvidia.dali.plugin.tf.DALIDataset`` placed on the GPU;
  iterating the loader hands out tensors on that GPU.
- ``dali-cpu``: the same pipeline entirely on the CPU, ``DALIDataset`` on ``/CPU:0``
  (``device_id=None``, no GPU needed).
- ``native``: ``tf.data`` + ``tf.io.decode_jpeg`` + ``tf.image`` ops mirroring the preset
  (``crossdali.tensorflow.presets``, the baseline a TensorFlow user runs today).
- ``synthetic``: one random batch repeated, to measure the model without an input pipeline.

Every backend yields ``images`` (N, H, W, C) float (``layout="CHW"`` for N, C, H, W) and ``labels``
(N,) int64, follows ``crossdali.common.loading.epochs`` and implements ``crossdali.common.loading.loaders.Loader``.

``DALILoader`` (``crossdali.tensorflow.dali_loader``) gives DALIDataset the epochs it lacks.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import tensorflow as tf

from crossdali.common.augment import check_auto_augment
from crossdali.common.classification import READER_NAME, ClassificationTransform, create_classification_pipeline
from crossdali.common.data.sources import DataSource, explain_decode_failure, find_undecodable, resolve_source
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import SplitPlan, prepare_split
from crossdali.common.options import CLASSIFICATION_BACKENDS
from crossdali.tensorflow.dali_loader import NO_DALI_CHECKPOINTS, DALILoader

__all__ = [
    "BACKENDS",
    "NativeLoader",
    "SyntheticLoader",
    "create_classification_dataset",
    "create_classification_loader",
]

log = logging.getLogger(__name__)

BACKENDS = CLASSIFICATION_BACKENDS

class NativeLoader:
    """tf.data batches from ``make_stream(epoch, skip)``, an endless stream of epochs starting at
    ``epoch`` with its first ``skip`` batches left out. Each epoch's order is a function of the
    epoch, so ``state_dict`` (epoch and batches consumed) resumes the same order mid-epoch
    (augmentation inside tf.data is not restored: it follows TensorFlow's op seeds)."""

    def __init__(self, make_stream: Callable[[int, int], tf.data.Dataset], *, steps: int, batch_size: int,
                 num_classes: int, num_samples: int, train: bool, source: DataSource) -> None:
        self._make_stream, self._steps, self.train = make_stream, steps, train
        self.batch_size, self.num_classes, self.num_samples = batch_size, num_classes, num_samples
        self.source, self.backend = source, "native"
        self.epoch, self._consumed, self._it = 0, 0, None

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def __len__(self) -> int:
        return self._steps - self._consumed

    def __iter__(self) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        if self._it is None:
            self._it = iter(self._make_stream(self.epoch, self._consumed))
        for _ in range(self._steps - self._consumed):
            try:
                batch = next(self._it)
            except tf.errors.OpError as e:
                raise self._explain(e) from e
            self._consumed += 1
            if self._consumed == self._steps:  # counted when the last batch is out, however the caller stops
                self.epoch, self._consumed = self.epoch + 1, 0
            yield batch

    @functools.cached_property
    def dataset(self) -> tf.data.Dataset:
        """Endless from epoch 0 for train (give Keras ``steps_per_epoch``), one epoch for val."""
        stream = self._make_stream(0, 0)
        return stream if self.train else stream.take(self._steps)

    def _explain(self, error: Exception) -> Exception:
        """A ``tf.io.decode_jpeg`` failure as a ``DataError`` naming the file (TF's message does not)."""
        if self.source.files and "jpeg" in str(error).lower():
            found = find_undecodable(self.source.files)
            if found is not None:
                path, reason = found
                return DataError(f"{path} cannot be decoded ({reason}); re-encode or remove it")
        return error

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._consumed, self._it = int(state["epoch"]), int(state.get("batches", 0)), None


class SyntheticLoader:
    """One random batch, repeated at the data loaders' batch sizes (``sizes``: ``SplitPlan.batch_sizes``, a
    PARTIAL epoch's short last batch included): the upper bound a training loop reaches with free
    input, step for step."""

    def __init__(self, *, sizes: list[int], batch_size: int, image_shape: tuple[int, ...], dtype: tf.DType,
                 num_classes: int) -> None:
        g = tf.random.Generator.from_seed(0)
        self.images = tf.cast(g.normal((batch_size, *image_shape), dtype=tf.float32), dtype)
        self.labels = g.uniform([batch_size], 0, max(1, num_classes), dtype=tf.int64)
        self.batch_size, self.num_classes, self.backend, self.epoch = batch_size, num_classes, "synthetic", 0
        self._sizes = list(sizes) or [batch_size]

    @property
    def steps_per_epoch(self) -> int:
        return len(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def __iter__(self) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        for i, n in enumerate(self._sizes):
            if i == len(self._sizes) - 1:
                self.epoch += 1
            yield (self.images, self.labels) if n == self.batch_size else (self.images[:n], self.labels[:n])

    @functools.cached_property
    def dataset(self) -> tf.data.Dataset:
        if all(n == self.batch_size for n in self._sizes):  # a static batch dimension, as before
            return tf.data.Dataset.from_tensors((self.images, self.labels)).repeat()
        images, labels = self.images, self.labels
        return tf.data.Dataset.from_tensor_slices(tf.constant(self._sizes, tf.int64)).repeat().map(
            lambda n: (images[:n], labels[:n]))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------


def _image_shape(transform: ClassificationTransform) -> tuple[int, int, int]:
    c = transform.crop_size
    return (c, c, 3) if transform.output_layout == "HWC" else (3, c, c)


def _native_loader(plan: SplitPlan, *, transform: ClassificationTransform, workers: int, seed: int) -> NativeLoader:
    """tf.data over the same contiguous shards as DALI (``[r*N//S, (r+1)*N//S)``). Train, files: one
    global permutation per epoch, seeded by (seed, epoch) and the same on every rank, as DALI's
    reader and PyTorch's ``ShardSampler`` do; train, TFRecord (read in sequence): each run of up to
    10,000 records of the shard in a seeded order."""
    from crossdali.tensorflow.presets import normalize, parse_tfrecord, train_image, val_image

    source, dist, train, bs = plan.source, plan.dist, plan.train, plan.batch_size
    n, rank, world = source.num_samples, dist.rank, dist.world_size
    lo, hi = rank * n // world, (rank + 1) * n // world
    drop = plan.policy == LastBatchPolicy.DROP
    per_epoch = (n // world) // bs * bs if drop else hi - lo  # samples of this shard used per epoch
    augment = train_image if train else val_image

    if source.format in ("imagefolder", "filelist"):
        files, labels = tf.constant(source.files), tf.constant(source.labels, tf.int64)

        def samples(epoch):  # (jpeg bytes, label) in this epoch's order
            order = tf.range(n, dtype=tf.int64)
            if train:
                order = tf.random.experimental.stateless_shuffle(order, seed=tf.stack([tf.constant(seed, tf.int64),
                                                                                      epoch]))
            order = order[lo:hi][:per_epoch]
            ds = tf.data.Dataset.from_tensor_slices((tf.gather(files, order), tf.gather(labels, order)))
            return ds, lambda f, y: (tf.io.read_file(f), y)
    elif source.format == "tfrecord":
        records = tf.data.TFRecordDataset(list(source.paths)).skip(lo).take(hi - lo)
        window = max(1, min(hi - lo, 10_000))

        def shuffle_run(index, run):  # one run of `window` records in an order keyed by (seed, epoch, run)
            order = tf.random.experimental.stateless_shuffle(tf.range(tf.shape(run, out_type=tf.int64)[0]),
                                                             seed=tf.stack([tf.constant(seed, tf.int64), index]))
            return tf.data.Dataset.from_tensor_slices(tf.gather(run, order))

        def samples(epoch):
            # Read in sequence, shuffled run by run with a stateless shuffle (as much memory as a shuffle
            # buffer of `window`). Dataset.shuffle with a seed that depends on the epoch tensor does not
            # trace when TensorFlow's global seed is 0, which the training scripts' default --seed sets.
            ds = records
            if train:
                ds = records.batch(window).enumerate().map(lambda i, run: (epoch * 1_000_003 + i, run)) \
                    .flat_map(shuffle_run)
            return ds.take(per_epoch), parse_tfrecord
    else:
        raise DataError(f"the native TensorFlow backend reads image files or TFRecord; {source.root} holds "
                        f"{source.format} records. Use --data-backend dali-cpu/dali-gpu.")

    def make_stream(first_epoch: int, skip_batches: int) -> tf.data.Dataset:
        def one_epoch(epoch):
            ds, read = samples(epoch)
            ds = ds.skip(tf.where(epoch == first_epoch, tf.constant(skip_batches * bs, tf.int64),
                                  tf.constant(0, tf.int64)))

            def decode(*sample):
                jpeg, label = read(*sample)
                return normalize(augment(jpeg, transform), transform), label

            ds = ds.map(decode, num_parallel_calls=max(1, workers), deterministic=True)
            return ds.batch(bs, drop_remainder=drop)

        return tf.data.Dataset.counter(first_epoch).flat_map(one_epoch).prefetch(2)

    steps = per_epoch // bs if drop else math.ceil(per_epoch / bs)
    return NativeLoader(make_stream, steps=steps, batch_size=bs, num_classes=source.num_classes, num_samples=n,
                        train=train, source=source)


def create_classification_loader(
    data: str | Path | DataSource,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 256,
    crop_size: int = 224,
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    data_format: str = "auto",
    dtype: str = "float32",
    layout: str = "HWC",
    hw_decoder_load: float = 1.0,
    last_batch: str | None = None,
    checkpointing: bool = False,
    auto_augment: str = "none",
    handover: str = "dataset",
    hold_batches: int = 4,
) -> DALILoader | NativeLoader | SyntheticLoader:
    """A loader of ``(images, labels)`` TensorFlow batches for the train or val split of ``data``,
    from any backend. The result implements ``crossdali.common.loading.loaders.Loader``; images are
    ``(N, H, W, C)`` (Keras' channels_last) or ``(N, C, H, W)``, labels ``(N,)`` int64.

    Args:
        data: a dataset folder (ImageFolder with ``train/`` and ``val/``, TFRecord, RecordIO, WebDataset or a
            file list; see ``crossdali.common.data.sources.resolve_source``) or a resolved ``DataSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads, or tf.data's parallel calls (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        data_format: ``auto`` or one of the layouts ``resolve_source`` reads.
        dtype: ``float32`` or ``float16`` outputs.
        layout: ``HWC`` (Keras' channels_last, the default) or ``CHW`` images.
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: must stay off: ``DALIDataset`` cannot restore a DALI checkpoint, so ``state_dict`` is
            epoch-level (docs/tensorflow.md).
        auto_augment: the train pipeline's augmentation policy (``crossdali.common.augment``: ``none``,
            ``autoaugment``, ``randaugment``, ``trivialaugment``), the same pixels in every framework for a
            given seed; DALI backends only.
        handover: how iterating a DALI loader takes its batches: ``dataset`` (``DALIDataset``, a copy that waits
            for TensorFlow's queued work), ``dlpack`` (DALI's buffers shared, no copy; see ``DALILoader``) or
            ``auto`` (``dlpack`` where TensorFlow can place them).
        hold_batches: with ``dlpack``, the batches whose DALI buffers stay alive after they are handed out: more
            than the steps a loop runs ahead of the GPU.
    """
    plan = prepare_split(data, train=train, backend=backend, backends=BACKENDS, source_type=DataSource,
                         resolve=lambda d, split: resolve_source(d, split, format=data_format),
                         batch_size=batch_size, dist=dist, last_batch=last_batch,
                         policies=(LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP))
    if checkpointing:
        raise ValueError(NO_DALI_CHECKPOINTS)
    source = plan.source
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype, output_layout=layout,
                                        auto_augment=check_auto_augment(auto_augment, backend=backend))
    if backend == "synthetic":
        return SyntheticLoader(sizes=plan.batch_sizes, batch_size=batch_size, image_shape=_image_shape(transform),
                               dtype=tf.float16 if dtype == "float16" else tf.float32, num_classes=source.num_classes)
    if backend == "native":
        return _native_loader(plan, transform=transform, workers=workers, seed=seed)
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, hw_decoder_load=hw_decoder_load)
    return DALILoader(plan, options,
                      lambda opts: create_classification_pipeline(source, train=train, options=opts, transform=transform),
                      names=("images", "labels"), reader_name=READER_NAME,
                      output_shapes=((batch_size, *_image_shape(transform)), (batch_size, 1)),
                      output_dtypes=(tf.float16 if dtype == "float16" else tf.float32, tf.int64),
                      explain=lambda e: explain_decode_failure(source, e), continuous=True, handover=handover,
                      hold_batches=hold_batches)


def create_classification_dataset(data: str | Path | DataSource, *, train: bool, **kwargs) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of ``create_classification_loader(data, train=train, **kwargs)``.

    train: endless (epochs follow each other in one stream): pass
    ``steps_per_epoch=create_classification_loader(...).steps_per_epoch`` to Keras, and never let
    Keras re-iterate it per epoch (a new iterator restarts DALI at epoch 0: same shuffle).
    val: exactly one epoch, every sample once across shards; iterating again repeats it.
    On ``dali-gpu`` its epoch bookkeeping runs on the host: iterate the loader itself to keep
    batches on the GPU (docs/tensorflow.md).

    Args:
        data: a dataset folder (ImageFolder with ``train/`` and ``val/``, TFRecord, RecordIO, WebDataset or a
            file list; see ``crossdali.common.data.sources.resolve_source``) or a resolved ``DataSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        kwargs: the arguments of the matching ``create_*_loader``.
    """
    return create_classification_loader(data, train=train, **kwargs).dataset
