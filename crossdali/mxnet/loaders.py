"""``create_classification_loader``: ``mx.io.DataIter`` batches from any backend.

DALI dropped its MXNet plugin after 1.39, so the DALI iterator is written here: a thin
``mx.io.DataIter`` over DALI's framework-neutral ``_DaliBaseIterator`` (the base DALI's own
PyTorch/TF/JAX/Paddle iterators share), which does the epoch accounting. Backends, chosen by name:

- ``dali-gpu``: the shared DALI pipeline with the mixed decoder; NDArrays on ``gpu(device_id)``.
- ``dali-cpu``: the same pipeline entirely on the CPU; NDArrays on ``cpu()``.
- ``native``: ``mx.io.ImageRecordIter`` (MXNet's C++ RecordIO loader) with the closest preset
  MXNet offers (the baseline; needs RecordIO data).
- ``synthetic``: one random batch repeated, to measure the model without any input pipeline.

Every backend yields ``mx.io.DataBatch`` with ``data=[images (N, C, H, W)]`` and
``label=[labels (N,) float32]`` and follows MXNet's last-batch convention: every batch has
``batch_size`` rows and the last one says in ``pad`` how many trailing rows are padding.
Every backend also implements the loader contract (``crossdali.common.loading.loaders.Loader``):
``len``, ``batch_size``, ``num_classes``, ``state_dict``/``load_state_dict``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import mxnet as mx
import numpy as np
from nvidia.dali.plugin.base_iterator import _DaliBaseIterator

from crossdali.common.augment import check_auto_augment
from crossdali.common.classification import READER_NAME, ClassificationTransform, create_classification_pipeline
from crossdali.common.data.sources import DataSource, explain_decode_failure, resolve_source
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.loading.epochs import LastBatchPolicy, batches_per_epoch
from crossdali.common.loading.loaders import SplitPlan, decode_dali_checkpoint, encode_dali_checkpoint, prepare_split
from crossdali.common.options import CLASSIFICATION_BACKENDS, PipelineOptions

__all__ = ["BACKENDS", "DATA_NAME", "LABEL_NAME", "DALIClassificationIter", "NativeRecordIter", "SyntheticIter",
           "create_classification_loader", "require_mxnet_gpu"]

log = logging.getLogger(__name__)

BACKENDS = CLASSIFICATION_BACKENDS
#: Names ``Module`` binds the batch to (``mx.sym.SoftmaxOutput`` reads ``softmax_label``).
DATA_NAME = "data"
LABEL_NAME = "softmax_label"


def _descs(batch_size: int, crop_size: int, dtype: str) -> tuple[list[mx.io.DataDesc], list[mx.io.DataDesc]]:
    data = mx.io.DataDesc(DATA_NAME, (batch_size, 3, crop_size, crop_size), np.dtype(dtype), layout="NCHW")
    label = mx.io.DataDesc(LABEL_NAME, (batch_size,), np.float32, layout="N")
    return [data], [label]


def require_mxnet_gpu(backend: str) -> None:
    """``dali-gpu`` hands DALI's GPU buffers to MXNet: refuse it, naming the fix, when MXNet sees no GPU."""
    if backend == "dali-gpu" and mx.context.num_gpus() == 0:
        raise RuntimeError("--data-backend dali-gpu needs MXNet built with CUDA and a visible GPU; this MXNet sees "
                           "none (the PyPI `mxnet` wheel is CPU-only; the CUDA builds, mxnet-cu112/cu117, run on GPUs "
                           "up to sm_86, not on Hopper or newer: see docs/mxnet.md). Use --data-backend dali-cpu")


class _EpochIter(mx.io.DataIter):
    """MXNet's ``reset()``/``next()`` convention joined to the loader contract, for every backend.

    - ``epoch``: epochs finished (read to the end, or cut short by a mid-epoch ``reset()``).
    - ``reset()`` starts the next epoch if anything was read since the last one, else does
      nothing (so ``Module.fit``'s reset followed by ``iter()`` does not skip an epoch);
      ``iter()`` does the same, so ``for batch in it`` works epoch after epoch.
    - ``state_dict()`` records ``epoch``, the batches read in the current epoch and whether its
      end was reached. A restored iterator continues the saved epoch: its first ``iter()`` or
      ``reset()`` does not start a new one (so a loop of ``reset(); for batch in it`` resumes
      where it stopped); a state saved at an epoch's end resumes with the next epoch.
    """

    def __init__(self, batch_size: int) -> None:
        super().__init__(batch_size)
        self.epoch = 0
        self._batches = 0  # batches handed out in the current epoch
        self._ended = False  # StopIteration raised for the current epoch
        self._dirty = False  # anything read since the last reset

    def __iter__(self):
        if self._dirty:
            self.reset()
        return self

    def _end_epoch(self) -> None:
        if not self._ended:
            self._ended = True
            self.epoch += 1

    def _reset_counters(self) -> None:
        self._batches, self._ended, self._dirty = 0, False, False

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batches": self._batches, "ended": self._ended}

    def _load_counters(self, state: dict) -> None:
        missing = {"epoch", "batches", "ended"} - set(state)
        if missing:
            raise ValueError(f"loader state {sorted(state)} lacks {sorted(missing)}: pass what state_dict() returned")
        self.epoch, self._batches, self._ended = int(state["epoch"]), int(state["batches"]), bool(state["ended"])
        self._dirty = self._ended  # mid-epoch: the next iter() or reset() continues the saved epoch


class DALIClassificationIter(_EpochIter, _DaliBaseIterator):
    """``mx.io.DataIter`` over the shared classification pipeline (CHW layout).

    - Hand-over: the pipeline runs DALI's dynamic executor, whose outputs are never recycled,
      so images and labels reach MXNet through DLPack without a copy (on GPU too: no host
      round trip). The capsule keeps DALI's buffer alive while the NDArray lives. A pipeline
      built with ``exec_dynamic=False`` gets a DALI-side copy instead.
    - Last batch: MXNet's convention, full-size with ``DataBatch.pad`` trailing padding rows
      (the reader repeats the shard's last sample); ``Module.score``/``predict`` drop them, a
      Gluon loop should slice ``[: batch_size - pad]``. A batch that would be padding only (a
      shard shorter than the longest one) is skipped.
    - ``reset()`` works mid-epoch too (``Module.fit(epoch_size=...)``): the rest of the epoch is
      run and discarded, so the next epoch starts at its beginning on every shard. DALI's own
      iterators ignore such a reset instead.
    - Built with ``options.checkpointing``, ``state_dict()`` carries DALI's pipeline checkpoint
      (reader position, shuffle and augmentation state, base64 text so the state is JSON), and
      ``load_state_dict`` rebuilds the pipeline from it: the batches after a resume are bit for
      bit those the uninterrupted iterator would have given.
    """

    def __init__(self, plan: SplitPlan, options: PipelineOptions, *, transform: ClassificationTransform) -> None:
        _EpochIter.__init__(self, options.batch_size)
        self.plan, self.source, self.policy = plan, plan.source, plan.policy
        self.num_classes = plan.num_classes
        self._transform = transform
        self._context = mx.gpu(options.device_id) if options.device == "gpu" else mx.cpu()
        self._provide_data, self._provide_label = _descs(options.batch_size, transform.crop_size, transform.dtype)
        self._len = plan.batches_per_epoch
        self._start(options)

    def _start(self, options: PipelineOptions) -> None:
        """Build the pipeline (from ``options.checkpoint`` if set) and DALI's epoch accounting."""
        self._options = options
        pipe = create_classification_pipeline(self.source, train=self.plan.train, options=options,
                                              transform=self._transform)
        self._pipes = []  # drop the previous pipeline (a restore) before the new one starts its threads
        # DROP is counted in next(), over DALI's PARTIAL: DALI's own DROP leaves a padded batch in the
        # pipeline for the next epoch (crossdali.common.loading.dali_loader.DALIIteratorLoader._iterator_policy)
        dali_policy = LastBatchPolicy.PARTIAL if self.policy == LastBatchPolicy.DROP else self.policy
        _DaliBaseIterator.__init__(self, [pipe], reader_name=READER_NAME, auto_reset=False,
                                   last_batch_policy=dali_policy, prepare_first_batch=False)
        self._copy = not pipe.exec_dynamic

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return self._provide_data

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return self._provide_label

    @property
    def context(self) -> mx.Context:
        return self._context

    @property
    def num_samples(self) -> int:
        """Samples per epoch over all shards."""
        return self.plan.num_samples

    def __len__(self) -> int:
        """Batches per epoch (an upper bound when a padding-only batch is skipped)."""
        return self._len

    def _to_mx(self, tensor) -> mx.nd.NDArray:
        # stream=None: DALI waits on the host until its GPU work is done, since MXNet's streams
        # are not exposed; no copy unless the executor may recycle the buffer.
        return mx.nd.from_dlpack(tensor.__dlpack__(stream=None, copy=self._copy))

    def _step(self, *, keep: bool) -> mx.io.DataBatch | None:
        """Advance by one batch; the ``DataBatch`` if ``keep`` and it holds real samples."""
        self._ever_consumed = True
        self._dirty = True
        try:
            outputs = self._get_outputs()[0]
        except RuntimeError as e:
            raise explain_decode_failure(self.source, e) from e
        batch = None
        if keep:
            images, labels = (self._to_mx(out.as_tensor()) for out in outputs)
            batch = [images, labels.reshape((-1,)).astype(np.float32)]
        self._schedule_runs()
        self._advance_and_check_drop_last()  # raises StopIteration when DROP ends the epoch
        if_drop, left = self._remove_padded()
        valid = int(left[0]) if np.any(if_drop) else self.batch_size
        if batch is None or valid <= 0:
            return None
        return mx.io.DataBatch(data=[batch[0]], label=[batch[1]], pad=self.batch_size - valid,
                               provide_data=self._provide_data, provide_label=self._provide_label)

    def next(self) -> mx.io.DataBatch:
        while True:
            # DROP: after len(self) full batches, the rest of the epoch is read and not handed out
            keep = self.policy != LastBatchPolicy.DROP or self._batches < self._len
            try:
                batch = self._step(keep=keep)
            except StopIteration:
                self._end_epoch()
                raise
            if batch is not None:
                self._batches += 1
                return batch

    def __next__(self) -> mx.io.DataBatch:
        return self.next()

    def reset(self) -> None:
        """Start the next epoch: at its end, or mid-way (the rest is run and discarded)."""
        if not self._dirty:
            return
        if not self._ended:
            log.debug("reset mid-epoch: running the remaining batches of this epoch")
            try:
                while True:
                    self._step(keep=False)
            except StopIteration:
                self._end_epoch()
        _DaliBaseIterator.reset(self)
        self._reset_counters()

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self._options.checkpointing:
            state["dali"] = encode_dali_checkpoint(self.checkpoints()[0])
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (what ``state_dict()`` returned, possibly through JSON)."""
        if "dali" not in state:
            self._load_counters(state)
            log.warning("loader state without a DALI checkpoint: epoch counter restored, but the data order "
                        "starts again as in a fresh run (build the loader with checkpointing=True)")
            self._batches, self._ended, self._dirty = 0, False, False
            return
        if not self._options.checkpointing:
            raise ValueError("this loader state holds a DALI checkpoint, but the loader was built without "
                             "checkpointing: pass checkpointing=True to create_classification_loader")
        fresh_size = self._size  # what DALI's PARTIAL epoch is for this shard
        self._start(replace(self._options, checkpoint=decode_dali_checkpoint(state["dali"])))
        if self.policy == LastBatchPolicy.DROP and self._size != fresh_size:
            # saved before DROP was counted in next(): the checkpoint carries DALI's DROP epoch size,
            # which would keep repeating samples in every later epoch
            log.warning("loader state from a crossdali older than its DROP fix: its DALI checkpoint would repeat "
                        "samples in every later epoch, so epoch %d starts again from its first batch, in a fresh "
                        "run's order", int(state["epoch"]))
            self._start(replace(self._options, checkpoint=None))
            state = {**state, "batches": 0, "ended": False}
        self._load_counters(state)


class SyntheticIter(_EpochIter):
    """One random batch, repeated: the speed a training loop reaches with free input."""

    def __init__(self, *, num_batches: int, batch_size: int, crop_size: int, num_classes: int,
                 dtype: str, context: mx.Context) -> None:
        super().__init__(batch_size)
        rng = np.random.default_rng(0)
        images = rng.standard_normal((batch_size, 3, crop_size, crop_size), dtype=np.float32)
        self._data = mx.nd.array(images, ctx=context, dtype=dtype)
        self._label = mx.nd.array(rng.integers(0, max(1, num_classes), batch_size), ctx=context, dtype=np.float32)
        self._provide_data, self._provide_label = _descs(batch_size, crop_size, dtype)
        self.num_classes, self._len = num_classes, num_batches

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return self._provide_data

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return self._provide_label

    def __len__(self) -> int:
        return self._len

    def reset(self) -> None:
        if self._dirty:
            self._end_epoch()
            self._reset_counters()

    def next(self) -> mx.io.DataBatch:
        self._dirty = True
        if self._batches >= self._len:
            self._end_epoch()
            raise StopIteration
        self._batches += 1
        return mx.io.DataBatch(data=[self._data], label=[self._label], pad=0,
                               provide_data=self._provide_data, provide_label=self._provide_label)

    def load_state_dict(self, state: dict) -> None:
        self._load_counters(state)


class NativeRecordIter(_EpochIter):
    """``mx.io.ImageRecordIter`` with the preset closest to the DALI pipeline.

    Differences MXNet does not let us remove: its random-resized-crop and resize use OpenCV
    (``inter_method=2``, area, is the closest to DALI's antialiased linear resize).

    Epochs follow the crossdali rule, not MXNet's ``round_batch`` (which wraps the last batch
    into the next pass and then, measured on 528 samples with batch 32, gave epochs of 528, 256
    and 272 samples). With an index, ``num_parts`` gives rank ``r`` the records
    ``[r*step, (r+1)*step)`` with ``step = ceil(n / parts)`` (measured); with
    ``round_batch=False`` MXNet fills the last batch with stale rows and reports ``pad=0``, so this
    wrapper counts the batches of its part and sets ``pad`` itself (``DROP``: only full batches,
    as many on every rank).

    ``load_state_dict`` replays the saved position: one ``ImageRecordIter.reset()`` per epoch
    started before (each reshuffles, from the seed), then the batches read of the current epoch
    are read again and discarded. The sample order is restored; the random crops are not
    (ImageRecordIter's augmentation generators cannot be saved).
    """

    def __init__(self, source: DataSource, *, train: bool, batch_size: int, transform: ClassificationTransform,
                 workers: int, seed: int, dist: DistInfo, policy: LastBatchPolicy) -> None:
        super().__init__(batch_size)
        t = transform
        preset = dict(
            random_resized_crop=True, min_random_area=t.random_area[0],
            max_random_area=t.random_area[1], min_aspect_ratio=t.random_aspect_ratio[0],
            max_aspect_ratio=t.random_aspect_ratio[1], rand_mirror=True, shuffle=True,
        ) if train else dict(resize=t.val_resize_size, rand_crop=False, rand_mirror=False, shuffle=False)
        self._it = mx.io.ImageRecordIter(
            path_imgrec=source.paths[0], path_imgidx=source.index_paths[0], data_shape=(3, t.crop_size, t.crop_size),
            batch_size=batch_size, label_width=1, data_name=DATA_NAME, label_name=LABEL_NAME,
            mean_r=t.mean[0], mean_g=t.mean[1], mean_b=t.mean[2], std_r=t.std[0], std_g=t.std[1], std_b=t.std[2],
            inter_method=2,  # area-based (cv2.INTER_AREA) is the closest to antialiased linear
            num_parts=dist.world_size, part_index=dist.rank, round_batch=False, preprocess_threads=max(1, workers),
            seed=seed, seed_aug=seed + dist.rank, dtype=t.dtype, ctx="cpu", **preset)
        self.source = source
        self.num_classes = source.num_classes
        n, step = source.num_samples, math.ceil(source.num_samples / dist.world_size)
        part_size = min(step * (dist.rank + 1), n) - min(step * dist.rank, n)
        if policy == LastBatchPolicy.DROP:
            self._len = batches_per_epoch(n, batch_size=batch_size, num_shards=dist.world_size, policy=policy)
            self._last_pad = 0
        else:
            self._len = math.ceil(part_size / batch_size)
            self._last_pad = self._len * batch_size - part_size

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return self._it.provide_data

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return self._it.provide_label

    def __len__(self) -> int:
        return self._len

    def reset(self) -> None:
        if self._dirty:
            self._end_epoch()  # a mid-epoch reset cuts the epoch short
            self._it.reset()
            self._reset_counters()

    def next(self) -> mx.io.DataBatch:
        self._dirty = True
        if self._batches >= self._len:
            self._end_epoch()
            raise StopIteration
        batch = self._it.next()
        self._batches += 1
        if self._batches == self._len:
            batch.pad = self._last_pad
        return batch

    def load_state_dict(self, state: dict) -> None:
        if self._dirty or self.epoch:
            raise ValueError("NativeRecordIter.load_state_dict replays the saved position from a fresh iterator: "
                             "call it before reading any batch")
        self._load_counters(state)
        for _ in range(self.epoch - 1 if self._ended else self.epoch):  # epochs started before the current one
            self._it.reset()
        if not self._ended:
            for _ in range(self._batches):
                self._it.next()


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
    hw_decoder_load: float = 1.0,
    last_batch: str | None = None,
    checkpointing: bool = True,
    auto_augment: str = "none",
) -> mx.io.DataIter:
    """An ``mx.io.DataIter`` over the train or val split of ``data``, with the arguments of
    ``crossdali.pytorch.create_classification_loader`` (``native`` reads RecordIO only). The result
    implements ``crossdali.common.loading.loaders.Loader`` and has ``provide_data`` and ``provide_label``.

    Args:
        data: a dataset folder (ImageFolder with ``train/`` and ``val/``, TFRecord, RecordIO, WebDataset or a
            file list; see ``crossdali.common.data.sources.resolve_source``) or a resolved ``DataSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads, or the native iterator's decoding threads (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        data_format: ``auto`` or one of the layouts ``resolve_source`` reads.
        dtype: ``float32`` or ``float16`` outputs.
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        auto_augment: the train pipeline's augmentation policy (``crossdali.common.augment``: ``none``,
            ``autoaugment``, ``randaugment``, ``trivialaugment``), the same pixels in every framework for a
            given seed; DALI backends only.
    """
    plan = prepare_split(data, train=train, backend=backend, backends=BACKENDS, source_type=DataSource,
                         resolve=lambda d, split: resolve_source(d, split, format=data_format),
                         batch_size=batch_size, dist=dist, last_batch=last_batch)
    source, dist = plan.source, plan.dist
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype, output_layout="CHW",
                                        auto_augment=check_auto_augment(auto_augment, backend=backend))
    require_mxnet_gpu(backend)

    if backend == "synthetic":
        num_gpus = mx.context.num_gpus()
        context = mx.gpu(dist.gpu_id(device_id, visible_gpus=num_gpus)) if num_gpus > 0 else mx.cpu()
        return SyntheticIter(num_batches=plan.batches_per_epoch, batch_size=batch_size, crop_size=crop_size,
                             num_classes=source.num_classes, dtype=dtype, context=context)
    if backend == "native":
        if source.format != "recordio":
            raise DataError(f"the native MXNet backend (mx.io.ImageRecordIter) reads RecordIO; {source.root} holds "
                            f"{source.format} data. Point --data at a folder with {plan.split}.rec + {plan.split}.idx "
                            "(the sample set has one in its recordio/ folder; MXNet's im2rec.py converts an "
                            "ImageFolder), or use --data-backend dali-cpu/dali-gpu.")
        return NativeRecordIter(source, train=train, batch_size=batch_size, transform=transform, workers=workers,
                                seed=seed, dist=dist, policy=plan.policy)

    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, hw_decoder_load=hw_decoder_load,
                                    checkpointing=checkpointing)
    return DALIClassificationIter(plan, options, transform=transform)
