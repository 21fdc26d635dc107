"""``create_classification_loader``: ``(images, labels)`` ``jax.Array`` batches from DALI's JAX
iterator, and the loader classes the detection and video factories share.

Backends, chosen by name (DeepLearningExamples' ``--data-backend``):

- ``dali-gpu``: the shared DALI pipeline with the mixed (GPU / hardware JPEG) decoder; arrays
  arrive on the JAX GPU device ``device_id`` through DLPack, without a host round trip.
- ``dali-cpu``: the same pipeline entirely on the CPU; arrays on JAX's CPU device (DALI's JAX
  iterator takes CPU pipelines: measured with DALI 2.4 and jax 0.10.2, see docs/jax.md).
- ``synthetic``: one random batch repeated, to measure the model without any input pipeline.

There is no ``native`` backend: JAX has no image input pipeline of its own (JAX users feed
tf.data, Grain or a PyTorch DataLoader), so there is no JAX-native baseline worth comparing;
the PyTorch and TensorFlow wrappers have those baselines.

Every backend yields ``images`` (N, H, W, C) float (``layout="CHW"`` for N, C, H, W; flax's
convolutions take NHWC) and ``labels`` (N,) int32 (JAX's default integer width; int64 under
``jax_enable_x64``), honours the epoch rules of ``crossdali.common.loading.epochs`` and implements the
loader contract (``crossdali.common.loading.loaders.Loader``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding
from nvidia.dali.plugin.jax import DALIGenericIterator

from crossdali.common.augment import check_auto_augment
from crossdali.common.classification import READER_NAME, ClassificationTransform, create_classification_pipeline
from crossdali.common.data.sources import DataSource, explain_decode_failure, resolve_source
from crossdali.common.distributed import DistInfo
from crossdali.common.loading.dali_loader import DALIIteratorLoader
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import prepare_split

__all__ = ["BACKENDS", "PADDING_LABEL", "DALIJaxIterator", "DALILoader", "ShardedDALILoader", "SyntheticLoader",
           "create_classification_loader", "require_gpu"]

log = logging.getLogger(__name__)

BACKENDS = ("dali-gpu", "dali-cpu", "synthetic")


def _gpu_devices() -> list:
    try:
        return jax.devices("gpu")
    except RuntimeError:  # "Unknown backend gpu": a CPU-only jaxlib
        return []


def require_gpu(backend: str, hint: str = "use dali-cpu") -> None:
    """A clear error when ``dali-gpu`` is asked of a JAX that sees no GPU."""
    if backend == "dali-gpu" and not _gpu_devices():
        raise RuntimeError(f"--data-backend dali-gpu needs a CUDA GPU visible to JAX, and this JAX has only "
                           f"{jax.default_backend()} devices (a CPU-only jaxlib? install the CUDA build: "
                           f"pip install 'jax[cuda13]=={jax.__version__}'); {hint}")


def _no_native(backend: str) -> None:
    if backend == "native":
        raise ValueError("crossdali.jax has no 'native' backend: JAX has no image input pipeline of its own to "
                         "compare with; use dali-cpu or dali-gpu (the native baselines are in crossdali.pytorch "
                         "and crossdali.tensorflow)")


#: the label of a padding row in a sharded val batch (``ShardedDALILoader``): no class has it
PADDING_LABEL = -1


class DALIJaxIterator(DALIGenericIterator):
    """DALI's JAX iterator plus the ``PARTIAL`` last batch it refuses ("JAX iterator does not
    support partial last batch policy").

    crossdali's readers pad every shard's last batch (``pad_last_batch=True``), so the iterator
    runs with ``FILL`` and this class cuts the padding rows off, with the same arithmetic as DALI's
    PyTorch iterator (``_remove_padded``): an epoch then holds every sample exactly once. A
    shard's padding-only last batch comes out with 0 rows (the loader skips it). The smaller last
    batch costs one more XLA compilation of a jitted step (its shape is new); pass
    ``last_batch="drop"`` to the factory where that matters more than seeing every sample.

    ``device``: the JAX device every batch is put on (a no-op where DALI wrote to that GPU).
    ``mark_padding``: under ``FILL``, the output (the labels) whose padding rows are set to
    ``PADDING_LABEL``, so that a full batch still says which of its rows are samples.
    """

    def __init__(self, pipelines, output_map: list[str], *, reader_name: str,
                 last_batch_policy: LastBatchPolicy = LastBatchPolicy.FILL, device: jax.Device | None = None,
                 mark_padding: str | None = None, **kwargs) -> None:
        # set before DALI's constructor, which prepares the first batch through _next_impl
        self._partial = last_batch_policy == LastBatchPolicy.PARTIAL
        self._device, self._mark_padding = device, mark_padding
        super().__init__(pipelines, output_map, reader_name=reader_name,
                         last_batch_policy=LastBatchPolicy.FILL if self._partial else last_batch_policy, **kwargs)
        if self._partial and not self._last_batch_padded:
            raise ValueError(f"a PARTIAL last batch needs the reader {reader_name!r} built with pad_last_batch=True")

    def _next_impl(self) -> dict[str, jax.Array]:
        batch = super()._next_impl()
        if self._partial or self._mark_padding:
            # _counter has passed this batch; rows past the shard's end are the reader's padding
            shard_size = int(self._shard_sizes_per_gpu_initial[self._shards_id[0]])
            valid = max(0, min(self.batch_size, shard_size - (int(self._counter) - self.batch_size)))
            if self._partial:
                batch = {k: v[:valid] if v.shape[0] > valid else v for k, v in batch.items()}
            elif valid < self.batch_size:  # FILL keeps the shape; the padding rows' label says they are padding
                batch[self._mark_padding] = batch[self._mark_padding].at[valid:].set(PADDING_LABEL)
        if self._device is not None:  # a no-op where DALI wrote to that GPU; dali-cpu: onto that CPU device
            batch = {k: jax.device_put(v, self._device) for k, v in batch.items()}
        return batch


class DALILoader(DALIIteratorLoader):
    """DALI's JAX iterator over one of the shared pipelines (``crossdali.common.loading.dali_loader``): plain
    tuples of ``jax.Array``, epochs (PARTIAL through ``DALIJaxIterator``), padding-only batches
    skipped, errors naming the file, ``state_dict`` with DALI's checkpoint (the JAX iterator shares
    the checkpointing base of DALI's other iterators) for a bit-exact mid-epoch resume."""

    def _new_iterator(self, pipeline) -> DALIJaxIterator:
        return DALIJaxIterator([pipeline], list(self.names), reader_name=self.reader_name,
                               last_batch_policy=self._iterator_policy, auto_reset=True)

    def _outputs(self, raw) -> dict:
        return raw

    def _flat(self, array: jax.Array) -> jax.Array:
        return array.reshape(-1)

    def _concat(self, arrays: list[jax.Array]) -> jax.Array:
        top = [max(d) for d in zip(*(a.shape[1:] for a in arrays))]
        if any(list(a.shape[1:]) != top for a in arrays):  # outputs padded with 0 to each part's longest
            # (detection's boxes and labels): padded to the longest of all
            arrays = [jax.numpy.pad(a, [(0, 0), *((0, m - n) for m, n in zip(top, a.shape[1:]))]) for a in arrays]
        return jax.numpy.concatenate(arrays)


class ShardedDALILoader(DALILoader):
    """Data-parallel batches: one DALI pipeline per device of ``sharding`` that this process holds, each
    reading its own shard (the device's index in the mesh: shard ``process * devices + i`` of all
    devices, ``crossdali.common.options.sub_shard_options``) with ``dali-gpu`` on that GPU, and every
    batch one global ``jax.Array`` split over the devices (``jax.make_array_from_single_device_arrays``,
    what DALI's JAX iterator does with ``sharding=``; no copy). Across processes the arrays together
    form the global batch of the whole job, so a step jitted over the mesh sees every device's part.

    Every device's part has one shape, so an epoch's last batch cannot be short: train drops the
    remainder (``DROP``, as under several processes), val reads full batches (``FILL``) whose padding
    rows carry the label ``PADDING_LABEL``, which an eval step leaves out: val still counts every
    sample once."""

    def __init__(self, plan, options, build, *, sharding: NamedSharding, mark_padding: bool = False,
                 **kwargs) -> None:
        self.sharding = sharding
        process = jax.process_index()
        mesh_devices = list(sharding.mesh.devices.flat)
        self.devices = [d for d in mesh_devices if d.process_index == process]  # this process's, in mesh order
        self._first_shard = mesh_devices.index(self.devices[0])
        self._mark = mark_padding
        self._device: jax.Device | None = None
        super().__init__(plan, options, build, **kwargs)

    def _make_iterator(self, options):
        self._device = self.devices[options.shard_id - self._first_shard]
        if options.device == "gpu":  # dali-gpu writes to the GPU of this part
            options = replace(options, device_id=self._device.local_hardware_id)
        return super()._make_iterator(options)

    def _new_iterator(self, pipeline) -> DALIJaxIterator:
        return DALIJaxIterator([pipeline], list(self.names), reader_name=self.reader_name,
                               last_batch_policy=self._iterator_policy, auto_reset=True, device=self._device,
                               mark_padding="labels" if self._mark else None)

    def _outputs(self, raw) -> dict:
        return {k: v.reshape(-1) if k in self.flatten else v for k, v in raw.items()}

    def _flat(self, array: jax.Array) -> jax.Array:
        return array  # flattened per device in _outputs, before the parts become one array

    def _concat(self, arrays: list[jax.Array]) -> jax.Array | None:
        if len({a.shape for a in arrays}) != 1:
            return None  # the counted DROP's short tail, which the epoch reads but never yields
        shape = (arrays[0].shape[0] * self.sharding.mesh.size, *arrays[0].shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.sharding, arrays)

    def _next(self) -> dict | None:
        batch = super()._next()
        if batch is not None and len(self._iters) == 1:  # one device here: its part becomes the global array
            batch = {n: self._concat([x]) for n, x in batch.items()}
        return batch


def shard_host_batch(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """A host array that every process holds whole, as one ``jax.Array`` split by ``sharding`` (each
    process places only its own devices' rows)."""
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


class SyntheticLoader:
    """One random batch, repeated: the upper bound a training loop reaches with free input. ``sizes``
    are an epoch's batch sizes (``crossdali.common.loading.epochs.batch_sizes``: the data loaders' own, the
    short last one included, so its epoch has the same steps as theirs)."""

    def __init__(self, *, batch_size: int, shape: tuple[int, ...], num_classes: int, device: jax.Device,
                 dtype: str, sizes: list[int], sharding: NamedSharding | None = None) -> None:
        rng = np.random.default_rng(0)  # numpy: jax.random would compile its generator first (seconds on a CPU)
        images = rng.standard_normal((batch_size, *shape), dtype=np.float32).astype(dtype)
        labels = rng.integers(0, max(1, num_classes), batch_size, dtype=np.int32)
        if sharding is None:
            self.images, self.labels = jax.device_put(images, device), jax.device_put(labels, device)
        else:  # the same global batch in every process (one seed), split over the devices
            self.images, self.labels = shard_host_batch(images, sharding), shard_host_batch(labels, sharding)
        self.batch_size, self.num_classes, self.epoch = batch_size, num_classes, 0
        self.sizes = list(sizes) or [batch_size]
        short = {n for n in self.sizes if n != batch_size}  # sliced once, not every epoch
        self._short = {n: (self.images[:n], self.labels[:n]) for n in short}

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self):
        for n in self.sizes:
            yield self._short.get(n, (self.images, self.labels))
        self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])


def default_device(device_id: int | None = None, dist: DistInfo | None = None) -> jax.Device:
    """The GPU ``device_id`` (default: the local rank's, or the one GPU a launcher bound this process to)
    when JAX has GPUs, else the CPU."""
    gpus = _gpu_devices()
    if not gpus:
        return jax.devices("cpu")[0]
    if device_id is not None:
        return gpus[device_id % len(gpus)]
    local = [d for d in gpus if d.process_index == jax.process_index()]
    return local[(dist or DistInfo()).gpu_id(visible_gpus=len(local))]


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
    layout: str = "HWC",
    last_batch: str | None = None,
    checkpointing: bool = True,
    sharding: NamedSharding | None = None,
    auto_augment: str = "none",
):
    """An iterable of ``(images, labels)`` ``jax.Array`` batches for the train or val split of ``data``.

    The arguments of ``crossdali.pytorch.create_classification_loader``, plus ``layout``. The result
    implements ``crossdali.common.loading.loaders.Loader``.

    Args:
        data: a dataset folder (ImageFolder with ``train/`` and ``val/``, TFRecord, RecordIO, WebDataset or a
            file list; see ``crossdali.common.data.sources.resolve_source``) or a resolved ``DataSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once across shards).
        backend: ``dali-gpu`` or ``dali-cpu``, and where this factory offers them ``native`` or ``synthetic``
            (the module's ``*BACKENDS``).
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads (with ``sharding``: shared among this process's pipelines).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        data_format: ``auto`` or one of the layouts ``resolve_source`` reads.
        dtype: ``float32`` or ``float16`` outputs.
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        layout: ``HWC`` (flax's NHWC, the default) or ``CHW`` images.
        last_batch: the epoch rule's last batch overridden: ``partial``, ``drop`` or ``fill``.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        sharding: data-parallel batches over the devices of this ``NamedSharding`` (one mesh axis, the
            batch split along it: ``crossdali.jax.parallel.batch_sharding``): one pipeline per device of
            this process, ``batch_size`` samples each, and every batch one global array of
            ``batch_size x`` all devices (``ShardedDALILoader``); ``dist`` is then this process's place
            among JAX's processes (default: ``jax.process_index()`` of ``jax.process_count()``).
            None: one device, one pipeline (``device_id``).
        auto_augment: the train pipeline's augmentation policy (``crossdali.common.augment``: ``none``,
            ``autoaugment``, ``randaugment``, ``trivialaugment``), the same pixels in every framework for a
            given seed; DALI backends only.
    """
    _no_native(backend)
    local = 1
    if sharding is not None:
        dist, local = _check_sharding(sharding, dist)
        if last_batch == "partial":
            raise ValueError("last_batch='partial' cannot be split over devices (every device's part of a batch has "
                             "one shape): use 'drop' or 'fill', or sharding=None")
        last_batch = last_batch or ("drop" if train else "fill")
    plan = prepare_split(data, train=train, backend=backend, backends=BACKENDS, source_type=DataSource,
                         resolve=lambda d, split: resolve_source(d, split, format=data_format),
                         batch_size=batch_size * local, dist=dist, last_batch=last_batch,
                         pipelines=local if backend != "synthetic" else 1)
    source = plan.source
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype, output_layout=layout,
                                        auto_augment=check_auto_augment(auto_augment, backend=backend))

    if backend == "synthetic":
        shape = (crop_size, crop_size, 3) if layout == "HWC" else (3, crop_size, crop_size)
        if sharding is not None:
            return SyntheticLoader(batch_size=batch_size * sharding.mesh.size, shape=shape,
                                   num_classes=source.num_classes, device=None, dtype=dtype,
                                   sizes=[batch_size * sharding.mesh.size] * len(plan.batch_sizes), sharding=sharding)
        return SyntheticLoader(batch_size=batch_size, shape=shape,
                               num_classes=source.num_classes, device=default_device(device_id, plan.dist),
                               dtype=dtype, sizes=plan.batch_sizes)
    require_gpu(backend)
    options = plan.pipeline_options(workers=max(1, workers // local), seed=seed, device_id=device_id,
                                    hw_decoder_load=hw_decoder_load, checkpointing=checkpointing)
    build = dict(build=lambda opts: create_classification_pipeline(source, train=train, options=opts,
                                                                    transform=transform),
                 names=("images", "labels"), reader_name=READER_NAME, explain=lambda e: explain_decode_failure(source, e))
    if sharding is not None:
        return ShardedDALILoader(plan, options, sharding=sharding, mark_padding=not train and last_batch == "fill",
                                 **build)
    return DALILoader(plan, options, **build)


def _check_sharding(sharding: NamedSharding, dist: DistInfo | None) -> tuple[DistInfo, int]:
    """This process's place for a sharded loader, and how many of the mesh's devices it holds."""
    if not isinstance(sharding, NamedSharding) or len(sharding.mesh.axis_names) != 1:
        raise ValueError(f"sharding must be a NamedSharding over a mesh of one axis (the batch split along it: "
                         f"crossdali.jax.parallel.batch_sharding), got {sharding!r}")
    devices = list(sharding.mesh.devices.flat)
    process, processes = jax.process_index(), jax.process_count()
    local = [i for i, d in enumerate(devices) if d.process_index == process]
    dist = dist or DistInfo(rank=process, world_size=processes, local_rank=0, launcher="jax")
    if not local or local != list(range(dist.rank * len(local), (dist.rank + 1) * len(local))) \
            or len(devices) != len(local) * dist.world_size:
        raise ValueError(f"the mesh's devices must be grouped by process, the same number in each, process "
                         f"{dist.rank}'s at positions {dist.rank} x that number onward: build the sharding with "
                         f"crossdali.jax.parallel.batch_sharding()")
    return dist, len(local)
