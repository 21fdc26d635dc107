"""``create_classification_loader`` / ``create_classification_dataset``: TensorFlow batches from any backend.

Backends, chosen by name (DeepLearningExamples' ``--data-backend``):

- ``dali-gpu``: the shared DALI pipeline (``crossdali.common.classification``) with the mixed
  (GPU / hardware JPEG) decoder, wrapped in ``nvidia.dali.plugin.tf.DALIDataset`` on ``/gpu:N``.
- ``dali-cpu``: the same pipeline entirely on the CPU, ``DALIDataset`` on ``/cpu:0``
  (``device_id=None``, no GPU needed).
- ``native``: ``tf.data`` + ``tf.io.decode_jpeg`` + ``tf.image`` ops mirroring the preset (the
  baseline a TensorFlow user runs today). Reads the same files/labels, or the same TFRecord.
- ``synthetic``: one random batch repeated, to measure the model without an input pipeline.

Every backend yields ``images`` (N, H, W, C) float (``layout="CHW"`` for N, C, H, W) and ``labels``
(N,) int64, and follows ``crossdali.common.epochs``.

Epochs. ``DALIDataset`` is an endless stream and knows nothing of epochs (no ``reader_name``, no
``LastBatchPolicy``), and every ``iter()`` over it builds a *new* pipeline that starts again at
epoch 0 (same shuffle, same augmentation). So the wrapper reads the reader's metadata once
(``epoch_size``, ``pad_last_batch``, ``stick_to_shard``), computes which rows of which batch of
each reader epoch are real samples (the reader pads every shard to the same number of batches by
repeating the shard's last sample, and without ``stick_to_shard`` moves to the next shard each
epoch), and filters/trims the stream in the graph: PARTIAL keeps each real sample once (val:
exactly once across shards), DROP keeps the first ``(N // shards) // batch`` full batches of every
reader epoch. Train on one long-lived iterator: ``loader`` iteration does that, and Keras does it
when given ``steps_per_epoch=loader.steps_per_epoch``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tensorflow as tf

from crossdali.common.classification import (
    READER_NAME,
    ClassificationTransform,
    PipelineOptions,
    create_classification_pipeline,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.epochs import LastBatchPolicy, choose_last_batch_policy, log_epoch_plan
from crossdali.common.sources import DataError, DataSource, explain_decode_failure, find_undecodable, resolve_source

__all__ = [
    "BACKENDS",
    "EpochPlan",
    "TFClassificationLoader",
    "create_classification_loader",
    "create_classification_dataset",
    "dali_dataset",
    "check_pipeline_outputs",
]

log = logging.getLogger(__name__)

BACKENDS = ("dali-gpu", "dali-cpu", "native", "synthetic")


# --------------------------------------------------------------------------------------------
# Epoch bookkeeping over DALI's endless stream
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochPlan:
    """Real rows per batch of the reader's stream, for each epoch of one shard.

    ``valid[k, b]`` is how many leading rows of batch ``b`` of reader epoch ``e`` (with
    ``k = e % len(valid)``) are kept: 0 drops the batch. The reader yields
    ``batches_per_reader_epoch`` batches per epoch whatever the shard's size.
    """

    valid: np.ndarray  # (cycle, batches_per_reader_epoch) int64
    batch_size: int

    @property
    def batches_per_reader_epoch(self) -> int:
        return int(self.valid.shape[1])

    def steps(self, epoch: int) -> int:
        """Batches yielded in ``epoch`` (0-based) after padding removal."""
        return int(np.count_nonzero(self.valid[epoch % len(self.valid)]))

    def samples(self, epoch: int) -> int:
        return int(self.valid[epoch % len(self.valid)].sum())

    @classmethod
    def from_reader_meta(cls, meta: dict, *, batch_size: int, policy: LastBatchPolicy) -> EpochPlan:
        """Mirror of DALI's ``base_iterator`` arithmetic (shard sizes, padding, shard rotation)."""
        n, shards, shard_id = int(meta["epoch_size"]), int(meta["number_of_shards"]), int(meta["shard_id"])
        if not meta["pad_last_batch"]:
            raise ValueError("the reader must be built with pad_last_batch=True so that every shard yields "
                             "the same number of batches; crossdali's pipelines do this")
        sizes = np.array([(s + 1) * n // shards - s * n // shards for s in range(shards)], dtype=np.int64)
        per_epoch = math.ceil(int(sizes.max()) / batch_size)  # the reader pads every shard to this
        if policy not in (LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP):
            raise ValueError(f"the TensorFlow wrapper supports PARTIAL and DROP last-batch policies, got {policy.name}")
        rotation = [shard_id] if meta["stick_to_shard"] else [(shard_id + k) % shards for k in range(shards)]
        starts = np.arange(per_epoch, dtype=np.int64) * batch_size
        rows = []
        for shard in rotation:
            if policy == LastBatchPolicy.DROP:
                full = (n // shards) // batch_size  # same on every shard: equal optimizer steps
                rows.append(np.where(np.arange(per_epoch) < full, batch_size, 0))
            else:
                rows.append(np.clip(sizes[shard] - starts, 0, batch_size))
        return cls(valid=np.stack(rows).astype(np.int64), batch_size=batch_size)


def _apply_plan(stream: tf.data.Dataset, plan: EpochPlan) -> tf.data.Dataset:
    """Drop and trim the padded/surplus batches of DALI's stream, labels to shape (N,)."""
    table = tf.constant(plan.valid)
    per_epoch, cycle = plan.batches_per_reader_epoch, plan.valid.shape[0]

    def rows(i):
        return table[(i // per_epoch) % cycle, i % per_epoch]

    return (stream.enumerate()
            .filter(lambda i, batch: rows(i) > 0)
            .map(lambda i, batch: (batch[0][: rows(i)], tf.reshape(batch[1][: rows(i)], [-1])))
            .apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY)))


# --------------------------------------------------------------------------------------------
# DALIDataset construction with an early shape/dtype check
# --------------------------------------------------------------------------------------------


def check_pipeline_outputs(pipeline, *, output_shapes, output_dtypes) -> None:
    """Run ``pipeline`` once and raise ``ValueError`` if an output does not match what the
    dataset declares (per-sample shape and dtype; the batch dimension is not checked).

    DALIDataset only notices a mismatch inside ``IteratorGetNext``, mid-``fit``; this check
    makes it fail at construction with both shapes and the likely fix.
    """
    pipeline.build()
    outputs = pipeline.run()
    for i, (out, shape, dtype) in enumerate(zip(outputs, output_shapes, output_dtypes)):
        if hasattr(out, "as_cpu"):
            out = out.as_cpu()
        got = tuple(out.as_tensor().shape())[1:] if out.is_dense_tensor() else None
        want = tuple(tf.TensorShape(shape).as_list()[1:])
        if got is None:
            raise ValueError(f"pipeline output {i} has samples of different shapes (e.g. {out[0].shape()}), "
                             f"but the dataset declares {want} per sample: crop/resize every sample to one size")
        if len(got) != len(want) or any(w is not None and w != g for w, g in zip(want, got)):
            raise ValueError(f"pipeline output {i} has per-sample shape {got} but the dataset declares {want}; "
                             "make the declared output_shapes match the pipeline (crop_size and output_layout "
                             "of the ClassificationTransform) or fix the pipeline")
        got_dtype = np.dtype(np.asarray(out.as_tensor()).dtype)
        if got_dtype != tf.as_dtype(dtype).as_numpy_dtype:
            raise ValueError(f"pipeline output {i} has dtype {got_dtype} but the dataset declares "
                             f"{tf.as_dtype(dtype).name}; pass output_dtypes matching the pipeline")


def dali_dataset(pipeline, *, batch_size: int, output_shapes, output_dtypes, device_id: int | None,
                 check_outputs: bool = True) -> tf.data.Dataset:
    """``DALIDataset`` over ``pipeline`` on ``/cpu:0`` (``device_id=None``) or ``/gpu:device_id``.

    ``check_outputs`` runs the pipeline object once first (see ``check_pipeline_outputs``); the
    dataset itself runs a fresh copy deserialized from it, so the check consumes nothing.
    """
    import nvidia.dali.plugin.tf as dali_tf  # defer: the plugin loads a compiled TF op library

    shapes = tuple(tf.TensorShape(s) for s in output_shapes)
    dtypes = tuple(tf.as_dtype(d) for d in output_dtypes)
    for s in shapes:
        if s.rank is None or (s[0] is not None and s[0] != batch_size):
            raise ValueError(f"declared output shape {s} must start with the batch size {batch_size}")
    device = "/cpu:0" if device_id is None else _tf_gpu(device_id)
    with tf.device(device):
        ds = dali_tf.DALIDataset(pipeline=pipeline, batch_size=batch_size, output_shapes=shapes,
                                 output_dtypes=dtypes, device_id=device_id)
    if check_outputs:
        check_pipeline_outputs(pipeline, output_shapes=shapes, output_dtypes=dtypes)
    return ds


def _tf_gpu(device_id: int) -> str:
    """TF's name for physical GPU ``device_id``: a training script usually makes only its own GPU
    visible to TF (it is then ``/gpu:0``), while DALI still counts physical GPUs."""
    visible = tf.config.get_visible_devices("GPU")
    if not visible:
        raise RuntimeError("--data-backend dali-gpu needs a GPU visible to TensorFlow and none is "
                           "(tensorflow-cpu is installed, or CUDA is not set up); use dali-cpu")
    return "/gpu:0" if len(visible) == 1 else f"/gpu:{device_id}"


# --------------------------------------------------------------------------------------------
# The loader: one long-lived iterator, one epoch per `for` loop
# --------------------------------------------------------------------------------------------


class TFClassificationLoader:
    """``for images, labels in loader`` gives one epoch; the next loop continues the same stream.

    ``dataset`` is the underlying ``tf.data.Dataset``: endless for train (give Keras
    ``steps_per_epoch``), one epoch for val (every iteration restarts it). ``len()`` is the number
    of batches of the next epoch.
    """

    def __init__(self, dataset: tf.data.Dataset, *, stream: tf.data.Dataset | None, steps: EpochPlan | int,
                 batch_size: int, num_classes: int, num_samples: int, backend: str,
                 source: DataSource | None = None) -> None:
        self.dataset = dataset
        self._stream = stream if stream is not None else dataset
        self._steps = steps
        self.batch_size, self.num_classes, self.num_samples = batch_size, num_classes, num_samples
        self.backend, self.source = backend, source
        self.epoch = 0
        self._it = None

    def steps_in_epoch(self, epoch: int) -> int:
        return self._steps.steps(epoch) if isinstance(self._steps, EpochPlan) else self._steps

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch; for PARTIAL with unequal shards it is the first epoch's count."""
        return self.steps_in_epoch(0)

    def __len__(self) -> int:
        return self.steps_in_epoch(self.epoch)

    def __iter__(self) -> Iterator[tuple[tf.Tensor, tf.Tensor]]:
        if self._it is None:
            self._it = iter(self._stream)
        steps = self.steps_in_epoch(self.epoch)
        self.epoch += 1
        for _ in range(steps):
            try:
                yield next(self._it)
            except StopIteration:
                return  # a finite stream (native val) ends with its epoch; restart next time
            except tf.errors.OpError as e:
                raise self._explain(e) from e
        if not isinstance(self._steps, EpochPlan) and self._stream is self.dataset and self._finite():
            self._it = None

    def _explain(self, error: Exception) -> Exception:
        """A decoder failure as a ``DataError`` naming the file (neither DALI nor TF names it)."""
        if self.source is None:
            return error
        explained = explain_decode_failure(self.source, error)
        if explained is error and self.source.files and "jpeg" in str(error).lower():  # tf.io.decode_jpeg
            found = find_undecodable(self.source.files)
            if found is not None:
                path, reason = found
                return DataError(f"{path} cannot be decoded ({reason}); re-encode or remove it")
        return explained

    def _finite(self) -> bool:
        return self.dataset.cardinality() != tf.data.INFINITE_CARDINALITY


# --------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------


def _reader_plan(source: DataSource, *, train: bool, options: PipelineOptions, transform: ClassificationTransform,
                 policy: LastBatchPolicy, output_shapes, output_dtypes) -> EpochPlan:
    """Build a one-sample CPU twin of the pipeline: its reader metadata sizes the epochs, and its
    first sample checks the declared shapes before any DALIDataset runs (no GPU memory used)."""
    twin_opts = replace(options, batch_size=1, device="cpu", device_id=None, num_threads=1,
                        prefetch_queue_depth=1, initial_fill=1)
    twin = create_classification_pipeline(source, train=train, options=twin_opts, transform=transform)
    try:
        check_pipeline_outputs(twin, output_shapes=[(1, *tf.TensorShape(s).as_list()[1:]) for s in output_shapes],
                               output_dtypes=output_dtypes)
    except RuntimeError as e:
        raise explain_decode_failure(source, e) from e
    meta = twin.reader_meta(READER_NAME)
    del twin
    return EpochPlan.from_reader_meta(meta, batch_size=options.batch_size, policy=policy)


def _image_shape(transform: ClassificationTransform, batch: int | None) -> tuple:
    c = transform.crop_size
    return (batch, c, c, 3) if transform.output_layout == "HWC" else (batch, 3, c, c)


def _dali_loader(source: DataSource, *, train: bool, options: PipelineOptions, transform: ClassificationTransform,
                 policy: LastBatchPolicy, backend: str) -> TFClassificationLoader:
    bs = options.batch_size
    shapes = (_image_shape(transform, bs), (bs, 1))
    dtypes = (tf.float16 if transform.dtype == "float16" else tf.float32, tf.int64)
    plan = _reader_plan(source, train=train, options=options, transform=transform, policy=policy,
                        output_shapes=shapes, output_dtypes=dtypes)
    pipe = create_classification_pipeline(source, train=train, options=options, transform=transform)
    raw = dali_dataset(pipe, batch_size=bs, output_shapes=shapes, output_dtypes=dtypes,
                       device_id=options.pipeline_device_id, check_outputs=False)
    stream = _apply_plan(raw, plan)
    # val: one epoch, re-iterable (a fresh pipeline each time starts at epoch 0: same samples)
    dataset = stream if train else stream.take(plan.steps(0))
    return TFClassificationLoader(dataset, stream=stream, steps=plan, batch_size=bs,
                                  num_classes=source.num_classes, num_samples=source.num_samples,
                                  backend=backend, source=source)


def _normalize(images: tf.Tensor, transform: ClassificationTransform) -> tf.Tensor:
    mean = tf.constant(transform.mean, tf.float32)
    std = tf.constant(transform.std, tf.float32)
    return (tf.cast(images, tf.float32) - mean) / std


# libjpeg's accurate integer IDCT: what DALI's CPU decoder (libjpeg-turbo) and Pillow use. TF's
# default (fast IDCT) differs from them by about 1 level on average, up to 11 (measured).
_DCT = "INTEGER_ACCURATE"


def _native_train_image(jpeg: tf.Tensor, t: ClassificationTransform) -> tf.Tensor:
    """Random-resized crop read from the JPEG header (``decode_and_crop_jpeg``, fused like DALI's
    ``image_random_crop``), antialiased bilinear resize, coin-flip mirror."""
    shape = tf.image.extract_jpeg_shape(jpeg)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
        aspect_ratio_range=t.random_aspect_ratio, area_range=t.random_area, max_attempts=100,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    img = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3, dct_method=_DCT)
    img = tf.image.resize(img, [t.crop_size, t.crop_size], method="bilinear", antialias=True)
    img = tf.image.random_flip_left_right(img)
    return img


def _native_val_image(jpeg: tf.Tensor, t: ClassificationTransform) -> tf.Tensor:
    """Shorter side to ``val_resize_size`` (antialiased bilinear), centre crop: DALI's val ops with
    the same geometry (longer side truncated, crop anchor rounded half to even, as torchvision and
    ``crossdali.common.classification`` do)."""
    img = tf.io.decode_jpeg(jpeg, channels=3, dct_method=_DCT)
    h, w = tf.shape(img)[0], tf.shape(img)[1]
    short, resize = tf.minimum(h, w), t.val_resize_size
    longer = resize * tf.maximum(h, w) // short
    out = tf.where(h <= w, tf.stack([resize, longer]), tf.stack([longer, resize]))
    img = tf.image.resize(img, out, method="bilinear", antialias=True)
    img = tf.clip_by_value(tf.floor(img + 0.5), 0, 255)  # DALI's resize outputs uint8, rounded half up
    c = t.crop_size
    top = tf.cast(tf.round(tf.cast(out[0] - c, tf.float32) / 2), tf.int32)  # tf.round: half to even
    left = tf.cast(tf.round(tf.cast(out[1] - c, tf.float32) / 2), tf.int32)
    return img[top : top + c, left : left + c]


def _parse_tfrecord(record: tf.Tensor):
    from crossdali.common.sources import TFRECORD_IMAGE_KEY, TFRECORD_LABEL_KEY

    ex = tf.io.parse_single_example(record, {
        TFRECORD_IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        TFRECORD_LABEL_KEY: tf.io.FixedLenFeature([1], tf.int64, default_value=[-1]),
    })
    return ex[TFRECORD_IMAGE_KEY], ex[TFRECORD_LABEL_KEY][0]


def _native_loader(source: DataSource, *, train: bool, transform: ClassificationTransform, batch_size: int,
                   workers: int, seed: int, dist: DistInfo, policy: LastBatchPolicy) -> TFClassificationLoader:
    """tf.data over the same shards as DALI (contiguous ``[r*N//S, (r+1)*N//S)``); train shuffles
    inside the shard every epoch (DALI's file reader reshuffles globally)."""
    n, rank, world = source.num_samples, dist.rank, dist.world_size
    lo, hi = rank * n // world, (rank + 1) * n // world
    if source.format in ("imagefolder", "filelist"):
        files = tf.constant(source.files[lo:hi])
        labels = tf.constant(source.labels[lo:hi], tf.int64)
        ds = tf.data.Dataset.from_tensor_slices((files, labels)).map(lambda f, y: (tf.io.read_file(f), y))
        buffer = hi - lo
    elif source.format == "tfrecord":
        ds = tf.data.TFRecordDataset(list(source.paths)).skip(lo).take(hi - lo).map(_parse_tfrecord)
        buffer = min(hi - lo, 10_000)
    else:
        raise DataError(f"the native TensorFlow backend reads image files or TFRecord; {source.root} holds "
                        f"{source.format} records. Use --data-backend dali-cpu/dali-gpu.")
    if train:
        ds = ds.shuffle(buffer, seed=seed + rank, reshuffle_each_iteration=True)
    drop = policy == LastBatchPolicy.DROP
    if drop:
        ds = ds.take((n // world) // batch_size * batch_size)
    op = _native_train_image if train else _native_val_image
    ds = ds.map(lambda jpeg, y: (_layout(_normalize(op(jpeg, transform), transform), transform), y),
                num_parallel_calls=max(1, workers), deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=drop)
    steps = (n // world) // batch_size if drop else math.ceil((hi - lo) / batch_size)
    if train:
        ds = ds.repeat()
    ds = ds.prefetch(2)
    return TFClassificationLoader(ds, stream=None, steps=steps, batch_size=batch_size, num_classes=source.num_classes,
                                  num_samples=n, backend="native", source=source)


def _layout(img: tf.Tensor, t: ClassificationTransform) -> tf.Tensor:
    img = tf.cast(img, tf.float16 if t.dtype == "float16" else tf.float32)
    return tf.transpose(img, [2, 0, 1]) if t.output_layout == "CHW" else img


def _synthetic_loader(source: DataSource, *, transform: ClassificationTransform, batch_size: int, dist: DistInfo,
                      policy: LastBatchPolicy) -> TFClassificationLoader:
    g = tf.random.Generator.from_seed(0)
    images = g.normal(_image_shape(transform, batch_size), dtype=tf.float32)
    images = tf.cast(images, tf.float16 if transform.dtype == "float16" else tf.float32)
    labels = g.uniform([batch_size], 0, max(1, source.num_classes), dtype=tf.int64)
    ds = tf.data.Dataset.from_tensors((images, labels)).repeat()
    steps = max(1, (source.num_samples // dist.world_size) // batch_size) if policy == LastBatchPolicy.DROP \
        else math.ceil(source.num_samples / dist.world_size / batch_size)
    return TFClassificationLoader(ds, stream=None, steps=steps, batch_size=batch_size, num_classes=source.num_classes,
                                  num_samples=source.num_samples, backend="synthetic")


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
) -> TFClassificationLoader:
    """A loader of ``(images, labels)`` TF batches for the train or val split of ``data``.

    ``data`` is a dataset folder (ImageFolder with train/ and val/, TFRecord, RecordIO or file
    list, see ``crossdali.common.sources.resolve_source``) or an already resolved ``DataSource``.
    ``workers`` is DALI's thread count or tf.data's parallel calls. ``dist`` shards by the global
    rank (default: one process). ``device_id`` is the GPU for ``dali-gpu`` (default: the local
    rank). ``layout`` is ``"HWC"`` (Keras' channels_last, the default) or ``"CHW"``.
    ``last_batch`` overrides the epoch rule ('partial' | 'drop').
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if isinstance(data, DataSource) else resolve_source(data, split, format=data_format)
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype, output_layout=layout)
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    if policy == LastBatchPolicy.FILL:
        raise ValueError("last_batch='fill' is not supported by the TensorFlow wrapper; use 'partial' or 'drop'")
    if dist.is_main:
        log_epoch_plan(f"{split} ({backend}, {source.format} at {source.root})", source.num_samples,
                       batch_size=batch_size, num_shards=dist.world_size, policy=policy)
    if backend == "synthetic":
        return _synthetic_loader(source, transform=transform, batch_size=batch_size, dist=dist, policy=policy)
    if backend == "native":
        return _native_loader(source, train=train, transform=transform, batch_size=batch_size, workers=workers,
                              seed=seed, dist=dist, policy=policy)
    gpu = backend == "dali-gpu"
    options = PipelineOptions(
        batch_size=batch_size, device="gpu" if gpu else "cpu",
        device_id=(device_id if device_id is not None else dist.local_rank) if gpu else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size,
        hw_decoder_load=hw_decoder_load)
    if gpu:
        _tf_gpu(options.device_id)  # fail now, not at the first batch
    return _dali_loader(source, train=train, options=options, transform=transform, policy=policy, backend=backend)


def create_classification_dataset(data: str | Path | DataSource, *, train: bool, **kwargs) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of ``create_classification_loader(data, train=train, **kwargs)``.

    train: endless (epochs follow each other in one stream): pass
    ``steps_per_epoch=create_classification_loader(...).steps_per_epoch`` to Keras, and never let
    Keras re-iterate it per epoch (a new iterator restarts DALI at epoch 0: same shuffle).
    val: exactly one epoch, every sample once across shards; iterating again repeats it.
    """
    return create_classification_loader(data, train=train, **kwargs).dataset
