"""DALI pipelines through ``nvidia.dali.plugin.tf.DALIDataset``, with the epochs DALIDataset lacks:
the loader class the classification, detection and video factories of ``crossdali.tensorflow`` share.

Epochs over DALIDataset. ``DALIDataset`` is an endless stream that knows nothing of epochs (no
``reader_name``, no ``LastBatchPolicy``), and every ``iter()`` over it builds a *new* pipeline
that starts again at epoch 0. ``DALILoader`` reads the reader's metadata once from a one-sample
twin of the pipeline and tabulates which rows of which batch of each reader epoch are real
samples (``EpochPlan``: the reader pads every shard to the same number of batches and, without
``stick_to_shard``, moves to the next shard each epoch). Loader iteration applies that table in
Python to the tensors one long-lived iterator hands out, so GPU batches are sliced where they are
and never copied; ``loader.epoch_dataset`` applies the same table with tf.data ops, and
``loader.dataset`` (for ``model.fit``) is, for train on a GPU, the stream itself without padding.

Hand-over. Iterating the loader takes each batch from the pipeline in one of two ways (``handover``):
``dataset``, DALIDataset's own op, which copies the batch into TensorFlow's memory on TensorFlow's compute
stream and waits for that copy, i.e. for every step already queued there; or ``dlpack``, the pipeline run
directly and its outputs shared with TensorFlow through DLPack, without a copy and waiting only for DALI's
own stream. TensorFlow cannot say when its queued kernels have read a shared buffer, so the loader keeps
the last ``hold_batches`` batches' DALI buffers alive (docs/tensorflow.md#the-hand-over).
"""

from __future__ import annotations

import atexit
import collections
import functools
import logging
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import tensorflow as tf

from crossdali.common.errors import UsageError
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import SplitPlan
from crossdali.common.options import PipelineOptions
from crossdali.tensorflow.devices import enable_memory_growth, tf_device

__all__ = ["DALILoader", "EpochPlan", "HANDOVERS", "NO_DALI_CHECKPOINTS", "check_pipeline_outputs", "dali_dataset",
           "pipeline_run_kwargs"]

log = logging.getLogger(__name__)

#: Why TensorFlow loaders take no ``checkpointing`` (measured with DALI 2.4 / TF 2.21, docs/tensorflow.md).
NO_DALI_CHECKPOINTS = ("DALIDataset cannot restore a DALI pipeline checkpoint: over a pipeline built with "
                       "checkpoint=... it still starts at the first batch of a fresh run (measured with DALI 2.4), "
                       "and it has no way to save one. TensorFlow loaders resume at epoch boundaries "
                       "(state_dict/load_state_dict); leave checkpointing off")


#: How iterating a loader takes its batches from DALI (``DALILoader``'s ``handover``; ``auto``: ``dlpack``
#: where TensorFlow can place the shared buffers, else ``dataset``).
HANDOVERS = ("auto", "dataset", "dlpack")


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
    epoch_size: int  # samples (clips) of one reader epoch over all shards

    @property
    def batches_per_reader_epoch(self) -> int:
        return int(self.valid.shape[1])

    def rows(self, position: int) -> int:
        """Real rows of batch number ``position`` of a stream that started at reader epoch 0."""
        epoch, batch = divmod(position, self.batches_per_reader_epoch)
        return int(self.valid[epoch % len(self.valid), batch])

    def steps(self, epoch: int, *, start: int = 0) -> int:
        """Batches yielded in reader ``epoch`` (0-based) from its batch ``start`` on, padding removed."""
        return int(np.count_nonzero(self.valid[epoch % len(self.valid), start:]))

    def samples(self, epoch: int) -> int:
        return int(self.valid[epoch % len(self.valid)].sum())

    @classmethod
    def from_reader_meta(cls, meta: dict, *, batch_size: int, policy: LastBatchPolicy) -> EpochPlan:
        """Mirror of DALI's ``base_iterator`` arithmetic (shard sizes, padding, shard rotation)."""
        n, shards, shard_id = int(meta["epoch_size"]), int(meta["number_of_shards"]), int(meta["shard_id"])
        if not meta["pad_last_batch"]:
            raise ValueError("the reader must be built with pad_last_batch=True so that every shard yields "
                             "the same number of batches; crossdali's pipelines do this")
        if policy not in (LastBatchPolicy.PARTIAL, LastBatchPolicy.DROP):
            raise ValueError(f"the TensorFlow wrapper supports PARTIAL and DROP last-batch policies, got {policy.name}")
        sizes = np.array([(s + 1) * n // shards - s * n // shards for s in range(shards)], dtype=np.int64)
        per_epoch = math.ceil(int(sizes.max()) / batch_size)  # the reader pads every shard to this
        rotation = [shard_id] if meta["stick_to_shard"] else [(shard_id + k) % shards for k in range(shards)]
        starts = np.arange(per_epoch, dtype=np.int64) * batch_size
        rows = []
        for shard in rotation:
            if policy == LastBatchPolicy.DROP:
                full = (n // shards) // batch_size  # same on every shard: equal optimizer steps
                rows.append(np.where(np.arange(per_epoch) < full, batch_size, 0))
            else:
                rows.append(np.clip(sizes[shard] - starts, 0, batch_size))
        return cls(valid=np.stack(rows).astype(np.int64), batch_size=batch_size, epoch_size=n)


def _unfolded(x: tf.Tensor, unfold: int) -> tf.Tensor:
    """``(n, unfold, ...)`` as ``(n * unfold, ...)``: the samples a DALI sample holds (video's reads)."""
    return x if unfold == 1 else tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], axis=0))


def _planned(stream: tf.data.Dataset, plan: EpochPlan, *, names: tuple[str, ...],
             flatten: tuple[str, ...], unfold: int = 1) -> tf.data.Dataset:
    """``plan`` applied with tf.data ops (the ``.dataset`` view): padded and surplus batches
    dropped, short ones trimmed, samples unfolded, ``flatten`` outputs reshaped to (N,). These ops run
    on the host."""
    table = tf.constant(plan.valid)
    per_epoch, cycle = plan.batches_per_reader_epoch, plan.valid.shape[0]

    def rows(i):
        return table[(i // per_epoch) % cycle, i % per_epoch]

    def trim(i, batch):
        return tuple(tf.reshape(x[: rows(i)], [-1]) if n in flatten else _unfolded(x[: rows(i)], unfold)
                     for n, x in zip(names, batch))

    return (stream.enumerate().filter(lambda i, batch: rows(i) > 0).map(trim)
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


def pipeline_run_kwargs(pipeline) -> dict:
    """The pipeline's thread count and queue depths as DALIDataset arguments: DALIDataset does not read
    them from the pipeline (without them it runs 4 threads, whatever was asked)."""
    depth = pipeline.prefetch_queue_depth
    queues = (dict(exec_separated=True, cpu_prefetch_queue_depth=depth["cpu_size"],
                   gpu_prefetch_queue_depth=depth["gpu_size"]) if isinstance(depth, dict)
              else dict(prefetch_queue_depth=depth))
    return dict(num_threads=pipeline.num_threads, **queues)


def dali_dataset(pipeline, *, batch_size: int, output_shapes, output_dtypes, device_id: int | None,
                 check_outputs: bool = True, host_outputs: bool = False) -> tf.data.Dataset:
    """``DALIDataset`` over ``pipeline`` on ``/CPU:0`` (``device_id=None``) or on the TF GPU that is
    CUDA device ``device_id``, running with the pipeline's own thread count and queue depth.

    ``check_outputs`` runs the pipeline object once first (see ``check_pipeline_outputs``); the
    dataset itself runs a fresh copy deserialized from it, so the check consumes nothing.
    ``host_outputs``: a GPU pipeline with some outputs on the CPU (DALIDataset refuses it, "TF device
    and DALI device mismatch", unless told that they are to be copied to the GPU).
    """
    import nvidia.dali.plugin.tf as dali_tf  # defer: the plugin loads a compiled TF op library

    shapes = tuple(tf.TensorShape(s) for s in output_shapes)
    dtypes = tuple(tf.as_dtype(d) for d in output_dtypes)
    for s in shapes:
        if s.rank is None or (s[0] is not None and s[0] != batch_size):
            raise ValueError(f"declared output shape {s} must start with the batch size {batch_size}")
    with tf.device(tf_device(device_id)):
        ds = dali_tf.DALIDataset(pipeline=pipeline, batch_size=batch_size, output_shapes=shapes, output_dtypes=dtypes,
                                 device_id=device_id, fail_on_device_mismatch=not host_outputs,
                                 **pipeline_run_kwargs(pipeline))
    if check_outputs:
        check_pipeline_outputs(pipeline, output_shapes=shapes, output_dtypes=dtypes)
    return ds


# --------------------------------------------------------------------------------------------
# The loaders
# --------------------------------------------------------------------------------------------


#: loaders whose pipeline iterator is open, released at exit (``_release_at_exit``)
_OPEN_LOADERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register  # runs before TensorFlow's own exit handlers (registered at its import, earlier)
def _release_at_exit() -> None:
    """Release every open loader's iterator while Python is still up. An external-source loader's
    input is a ``from_generator`` dataset whose iterator, when released at interpreter teardown instead
    (its loader kept alive by a reference cycle), makes TensorFlow print "Error occurred when finalizing
    GeneratorDataset iterator: ... Python interpreter state is not initialized" at the end of a run."""
    for loader in list(_OPEN_LOADERS):
        loader.close()


class DALILoader:
    """One of the shared DALI pipelines through ``DALIDataset``, with the epochs DALIDataset lacks.

    ``for batch in loader`` is one epoch of tuples of tensors (the ``names`` outputs, those in
    ``flatten`` reshaped to (N,)), padding rows removed (``EpochPlan``), on the pipeline's device:
    ``dali-gpu`` batches stay on the GPU (the iterator is made under the GPU's device scope and
    the bookkeeping slices the eager GPU tensors). The next ``for`` continues the same stream.

    ``dataset`` is what ``model.fit`` takes: endless for train (give Keras ``steps_per_epoch``), one
    epoch for val. For train on a GPU it is ``stream_dataset`` where the pipeline allows (batches stay
    on the GPU); otherwise ``epoch_dataset``, the loader's exact epochs as host tf.data ops (any tf.data
    op after ``DALIDataset`` hands the batches over on the CPU: docs/tensorflow.md#loaderdataset).

    ``state_dict`` is epoch-level: DALIDataset cannot restore DALI's checkpoints (see
    ``NO_DALI_CHECKPOINTS``), so a restored loader continues the epoch count and starts that
    epoch's data from its beginning, in a fresh run's order. ``host_outputs``: the pipeline leaves
    some outputs on the CPU in GPU mode; DALIDataset copies them to the GPU. ``unfold`` > 1: each DALI
    sample holds that many samples (video's ``clips_per_read``): outputs arrive as ``(n, unfold, ...)``
    (``output_shapes`` declare that) and leave as ``(n * unfold, ...)``; ``batch_size`` and
    ``num_samples`` count the unfolded samples.

    ``handover`` (``HANDOVERS``): how iteration takes each batch from DALI, through ``DALIDataset`` (``dataset``,
    a copy into TensorFlow's memory that waits for TensorFlow's queued work) or through DLPack (``dlpack``, no copy;
    the last ``hold_batches`` batches' DALI buffers are kept alive, since TensorFlow may still be reading them:
    a loop must not run more than that many batches ahead of the GPU, and any loop that reads a step's result
    from the GPU within that many steps does not); ``auto`` is ``dlpack`` unless TensorFlow numbers the GPU
    otherwise than CUDA (several GPUs visible, one chosen with ``set_visible_devices``). The attribute holds
    the hand-over chosen. ``dataset``/``epoch_dataset``/``stream_dataset`` are ``DALIDataset`` whatever the
    hand-over.
    """

    def __init__(self, plan: SplitPlan, options: PipelineOptions, build: Callable[[PipelineOptions], object], *,
                 names: tuple[str, ...], output_shapes, output_dtypes, reader_name: str,
                 explain: Callable[[Exception], Exception], flatten: tuple[str, ...] = ("labels",),
                 twin_on_cpu: bool = True, host_outputs: bool = False, unfold: int = 1,
                 continuous: bool = False, handover: str = "dataset", hold_batches: int = 4) -> None:
        if options.checkpoint is not None:
            raise ValueError(NO_DALI_CHECKPOINTS)
        if handover not in HANDOVERS:
            raise ValueError(f"handover must be one of {', '.join(HANDOVERS)}, got {handover!r}")
        if hold_batches < 1:
            raise ValueError(f"hold_batches must be at least 1, got {hold_batches}")
        self.handover, self.hold_batches = handover, hold_batches
        self._pipe, self._held = None, collections.deque()
        self.plan, self.source, self.policy, self.backend = plan, plan.source, plan.policy, plan.backend
        self.unfold = unfold
        self.batch_size, self.num_classes = options.batch_size * unfold, plan.num_classes
        self.names, self.flatten, self._explain = names, flatten, explain
        if options.device == "gpu":
            enable_memory_growth()  # before anything below touches the GPU
        self.device = tf_device(options.pipeline_device_id)
        # TensorFlow places a DLPack tensor on "GPU:<the CUDA device number>" (tensorflow/c/eager/dlpack.cc)
        shareable = self.device in ("/CPU:0", f"/GPU:{options.pipeline_device_id}")
        if handover == "auto":
            self.handover = handover = "dlpack" if shareable else "dataset"
            if not shareable:
                log.info("CUDA device %d is TensorFlow's %s: batches go through DALIDataset (the dlpack hand-over "
                         "needs one GPU visible per process, e.g. CUDA_VISIBLE_DEVICES)", options.pipeline_device_id,
                         self.device)
        if handover == "dlpack" and not shareable:
            raise UsageError(f"the dlpack hand-over needs TensorFlow to number the GPUs as CUDA does, but CUDA device "
                             f"{options.pipeline_device_id} is TensorFlow's {self.device} (set_visible_devices hides "
                             "others): make one GPU visible per process with CUDA_VISIBLE_DEVICES, or use "
                             "handover='dataset' (--handover dataset)")
        shapes = tuple(tf.TensorShape(s) for s in output_shapes)
        dtypes = tuple(tf.as_dtype(d) for d in output_dtypes)
        self._epoch0, self._pos, self._it, self._closed = 0, 0, None, False
        self.epochs = self._epoch_plan(build, options, shapes, dtypes, twin_on_cpu=twin_on_cpu, reader_name=reader_name)
        # what the pipelines are built from: the dlpack hand-over's, the DALIDataset of iteration and of
        # epoch_dataset (``_raw``), and stream_dataset's own, each built only when used
        self._build_args = (build, options, shapes, dtypes, host_outputs)
        if handover == "dataset":
            self._raw  # noqa: B018 (built now: its errors surface here, as they always have)
        self._continuous = continuous and unfold == 1 and options.global_order is None and all(
            s[1:].num_elements() == 1 for n, s in zip(names, shapes) if n in flatten)

    @functools.cached_property
    def _raw(self) -> tf.data.Dataset:
        """The endless DALIDataset of the ``dataset`` hand-over and of the tf.data views."""
        build, options, shapes, dtypes, host_outputs = self._build_args
        return self._raw_dataset(build, options, shapes, dtypes, host_outputs=host_outputs)

    def _raw_dataset(self, build, options: PipelineOptions, shapes, dtypes, *, host_outputs: bool) -> tf.data.Dataset:
        """The endless DALIDataset the epoch plan is applied to."""
        return dali_dataset(build(options), batch_size=options.batch_size, output_shapes=shapes, output_dtypes=dtypes,
                            device_id=options.pipeline_device_id, check_outputs=False, host_outputs=host_outputs)

    def _epoch_plan(self, build, options, shapes, dtypes, *, twin_on_cpu: bool, reader_name: str) -> EpochPlan:
        """A one-sample twin of the pipeline: its reader metadata sizes the epochs, and its first
        sample checks the declared shapes before DALIDataset runs. On the CPU unless the data
        needs the GPU (H.264 video), so it costs no GPU memory."""
        twin_opts = replace(options, batch_size=1, num_threads=1, prefetch_queue_depth=1, initial_fill=1)
        if twin_on_cpu:
            twin_opts = replace(twin_opts, device="cpu", device_id=None)
        try:
            twin = build(twin_opts)
            check_pipeline_outputs(twin, output_shapes=[(1, *s[1:]) for s in shapes], output_dtypes=dtypes)
        except RuntimeError as e:
            raise self._explain(e) from e
        meta = twin.reader_meta(reader_name)
        del twin
        return EpochPlan.from_reader_meta(meta, batch_size=options.batch_size, policy=self.policy)

    @property
    def num_samples(self) -> int:
        """Samples per epoch over all shards (clips for video), as the reader counts them."""
        return self.epochs.epoch_size * self.unfold

    @property
    def epoch(self) -> int:
        """Epochs completed (a restored loader counts on from its state)."""
        return self._epoch0 + self._pos // self.epochs.batches_per_reader_epoch

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch for Keras; for PARTIAL with unequal shards it is the first epoch's count."""
        return self.epochs.steps(0)

    def __len__(self) -> int:
        """Batches the next ``for`` yields (the rest of the epoch if one was left mid-way)."""
        epoch, batch = divmod(self._pos, self.epochs.batches_per_reader_epoch)
        return self.epochs.steps(epoch, start=batch)

    def _next(self) -> tuple:
        if self._closed:
            raise RuntimeError("this loader was closed (close() released its DALI pipeline): create a new one")
        if self.handover == "dlpack":
            batch = self._shared_batch()
            self._pos += 1
            return batch
        try:  # the iterator's start runs the pipeline's first batches: a bad sample fails there already
            with tf.device(self.device):  # the iterator (and with it the batches) on the pipeline's device
                if self._it is None:
                    self._it = iter(self._raw)
                    _OPEN_LOADERS.add(self)
                batch = next(self._it)
        except tf.errors.OpError as e:
            raise self._explain(e) from e
        self._pos += 1
        return batch

    def _shared_batch(self) -> tuple:
        """The pipeline's next batch as TensorFlow tensors over DALI's own buffers (the ``dlpack`` hand-over)."""
        try:
            if self._pipe is None:
                build, options = self._build_args[:2]
                pipe = build(options)
                pipe.build()
                if not getattr(pipe, "_exec_dynamic", False):  # DALI would then reuse the buffers TensorFlow holds
                    raise ValueError("the dlpack hand-over needs DALI's default (dynamic) executor, which keeps "
                                     "each batch's buffers until they are released: build the pipeline without "
                                     "exec_dynamic=False and with one prefetch depth, or use handover='dataset'")
                self._pipe = pipe
                _OPEN_LOADERS.add(self)
            outputs = self._pipe.run()
        except RuntimeError as e:
            raise self._explain(e) from e
        self._held.append(outputs)
        while len(self._held) > self.hold_batches:
            self._held.popleft()
        # __dlpack__() with no stream waits on the host for DALI's stream only, not TensorFlow's
        batch = tuple(tf.experimental.dlpack.from_dlpack(out.as_tensor().__dlpack__()) for out in outputs)
        if self.device != "/CPU:0":
            with tf.device(self.device):  # outputs DALI left on the host (host_outputs) go to the GPU
                batch = tuple(x if "GPU" in x.device else tf.identity(x) for x in batch)
        return batch

    def close(self) -> None:
        """Release the DALI pipeline and its iterator now (also done for every open loader at exit);
        the loader cannot be iterated afterwards."""
        self._it, self._pipe, self._closed = None, None, True
        self._held.clear()
        _OPEN_LOADERS.discard(self)

    def __iter__(self) -> Iterator[tuple[tf.Tensor, ...]]:
        per_epoch = self.epochs.batches_per_reader_epoch
        end = (self._pos // per_epoch + 1) * per_epoch
        while self._pos < end:
            rows = self.epochs.rows(self._pos)
            batch = self._next()
            if rows == 0:
                continue
            # a shard's trailing padding-only batches are read now, so the epoch is complete (and
            # counted) once its last real batch is out, however the caller stops iterating
            while self._pos < end and self.epochs.rows(self._pos) == 0:
                self._next()
            with tf.device(self.device):  # sliced where they are (a GPU batch stays on the GPU)
                out = tuple(self._trim(name, x, rows) for name, x in zip(self.names, batch))
            yield out  # outside the device scope: the caller's code must not run under it

    def _trim(self, name: str, x: tf.Tensor, rows: int) -> tf.Tensor:
        if rows < self.epochs.batch_size:
            x = x[:rows]
        return tf.reshape(x, [-1]) if name in self.flatten else _unfolded(x, self.unfold)

    @functools.cached_property
    def dataset(self) -> tf.data.Dataset:
        """What ``model.fit`` takes: ``stream_dataset`` for train on a GPU where the pipeline allows it,
        else ``epoch_dataset``."""
        if self.plan.train and self._continuous and self._build_args[1].device == "gpu":
            return self.stream_dataset
        return self.epoch_dataset

    @functools.cached_property
    def epoch_dataset(self) -> tf.data.Dataset:
        """The loader's epochs exactly (padding rows cut, short last batches), as host tf.data ops:
        endless for train, one epoch for val. On a GPU every batch goes through host memory."""
        stream = _planned(self._raw, self.epochs, names=self.names, flatten=self.flatten, unfold=self.unfold)
        # val: one epoch, re-iterable (a fresh pipeline each time starts at epoch 0: the same samples)
        return stream if self.plan.train else stream.take(self.epochs.steps(0))

    @functools.cached_property
    def stream_dataset(self) -> tf.data.Dataset:
        """Train batches straight from ``DALIDataset``, on the pipeline's device, with no tf.data op
        after it: every batch full, the reader running on across epoch boundaries (tf.data's
        ``repeat().batch()``: every sample once per pass of the reader, a pass's last batch completed
        by the next pass's first samples; nothing padded, nothing left out). ``steps_per_epoch`` batches
        are then about one pass. Only for train pipelines that can run without padding (classification)."""
        if not (self.plan.train and self._continuous):
            raise ValueError("stream_dataset is for train loaders over the classification pipeline "
                             "(val, detection and video keep their padding: use epoch_dataset)")
        build, options, shapes, dtypes, host_outputs = self._build_args
        options = replace(options, pad_last_batch=False)
        # DALIDataset squeezes a declared (N,) from the pipeline's (N, 1): no reshape op needed
        shapes = tuple(tf.TensorShape(s[:1]) if n in self.flatten else s for n, s in zip(self.names, shapes))
        return dali_dataset(build(options), batch_size=options.batch_size, output_shapes=shapes, output_dtypes=dtypes,
                            device_id=options.pipeline_device_id, check_outputs=False, host_outputs=host_outputs)

    def state_dict(self) -> dict:
        per_epoch = self.epochs.batches_per_reader_epoch
        epoch, batch = divmod(self._pos, per_epoch)
        return {"epoch": self.epoch, "batches": self.epochs.steps(epoch) - self.epochs.steps(epoch, start=batch)}

    def load_state_dict(self, state: dict) -> None:
        if "dali" in state:
            raise ValueError("this loader state holds a DALI checkpoint (a PyTorch loader's); " + NO_DALI_CHECKPOINTS)
        self._epoch0, self._pos, self._it, self._pipe = int(state["epoch"]), 0, None, None
        if int(state.get("batches", 0)):
            log.warning("loader state saved %d batches into epoch %d: TensorFlow's DALI loaders resume at epoch "
                        "boundaries, so that epoch starts again from its first batch", state["batches"],
                        self._epoch0 + 1)
