"""``create_classification_loader``: (images, labels) torch batches from any backend, and the
loader classes the detection and video factories share.

Backends, chosen by name (DeepLearningExamples' ``--data-backend``):

- ``dali-gpu``: the shared DALI pipeline with the mixed (GPU / hardware JPEG) decoder; tensors
  arrive on ``cuda:<device_id>``.
- ``dali-cpu``: the same pipeline entirely on the CPU (no GPU needed); tensors on the CPU.
- ``native``: torchvision ``decode_image`` + the v2 preset in a ``DataLoader`` (the baseline).
- ``synthetic``: one random batch repeated, to measure the model without any input pipeline.

Every backend yields ``images`` (N, C, H, W) float and ``labels`` (N,) int64 (``channels_last``: the
same shape in torch's channels-last memory format), honours the same epoch rules
(``crossdali.common.loading.epochs``) and implements the loader contract (``crossdali.common.loading.loaders.Loader``:
``len``, ``batch_size``, ``num_classes``, ``state_dict``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from crossdali.common.augment import check_auto_augment
from crossdali.common.classification import READER_NAME, ClassificationTransform, create_classification_pipeline
from crossdali.common.data.sources import DataSource, explain_decode_failure, resolve_source
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError, UsageError
from crossdali.common.loading.cuda_queues import queues_hint
from crossdali.common.loading.dali_loader import DALIIteratorLoader
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import prepare_split
from crossdali.common.options import CLASSIFICATION_BACKENDS, DALI_BACKENDS

__all__ = ["BACKENDS", "create_classification_loader", "DALILoader", "NativeLoader", "ShardSampler",
           "SyntheticBatches"]

log = logging.getLogger(__name__)

BACKENDS = CLASSIFICATION_BACKENDS


def require_cuda(backend: str, hint: str = "use dali-cpu") -> None:
    if backend == "dali-gpu" and not torch.cuda.is_available():
        raise RuntimeError(f"--data-backend dali-gpu needs a CUDA GPU and none is visible; {hint}")


class DALILoader(DALIIteratorLoader):
    """DALI's PyTorch iterator over one of the shared pipelines (``crossdali.common.loading.dali_loader``):
    plain tuples of torch tensors, epochs, padding-only batches skipped, errors naming the file,
    ``state_dict`` with DALI's checkpoint for a bit-exact mid-epoch resume. On the GPU, a process that
    left ``CUDA_DEVICE_MAX_CONNECTIONS`` unset is told once how to keep DALI from falling behind the
    model (``crossdali.common.loading.cuda_queues``)."""

    _hinted = False  # the queues hint, once per process

    def __init__(self, plan, options, build, *, channels_last: bool = False, **kwargs) -> None:
        super().__init__(plan, options, build, **kwargs)
        self.channels_last = channels_last  # the pipeline emits NHWC; batches are its NCHW view
        if options.device == "gpu" and not DALILoader._hinted and (hint := queues_hint()):
            DALILoader._hinted = True
            log.warning(hint)

    def _new_iterator(self, pipeline):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # defer: DALI's torch plugin

        return DALIGenericIterator([pipeline], list(self.names), reader_name=self.reader_name,
                                   last_batch_policy=self._iterator_policy, auto_reset=True)

    def _outputs(self, raw) -> dict:
        outputs = raw[0]  # one pipeline
        if self.channels_last:  # a view: (N, C, H, W) with channels-last strides, no copy (torch.cat keeps them)
            outputs["images"] = outputs["images"].permute(0, 3, 1, 2)
        return outputs

    def _flat(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(-1)

    def _concat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        top = [max(d) for d in zip(*(t.shape[1:] for t in tensors))]
        if any(list(t.shape[1:]) != top for t in tensors):  # outputs padded with 0 to each part's longest
            # (detection's boxes and labels): padded to the longest of all
            tensors = [torch.nn.functional.pad(t, [p for d in reversed(range(1, t.ndim))
                                                   for p in (0, top[d - 1] - t.shape[d])]) for t in tensors]
        return torch.cat(tensors)


class ShardSampler(torch.utils.data.Sampler):
    """Contiguous shard ``rank`` of ``world``, shuffled per epoch when training.

    Written here because torch's DistributedSampler pads shards with duplicates (drop_last=False)
    or drops samples (drop_last=True); this one matches DALI's sharding instead: val sees every
    sample exactly once across ranks, train under several ranks drops to equal batch counts.
    ``epoch`` picks the permutation (the same on every rank); ``skip`` leaves out the first
    samples of the epoch (a mid-epoch resume).
    """

    def __init__(self, n: int, *, rank: int, world: int, shuffle: bool, seed: int,
                 batch_size: int, policy: LastBatchPolicy) -> None:
        self.n, self.rank, self.world, self.shuffle, self.seed = n, rank, world, shuffle, seed
        self.batch_size, self.policy, self.epoch, self.skip = batch_size, policy, 0, 0

    def indices(self) -> list[int]:
        order = torch.arange(self.n)
        if self.shuffle:  # the same global permutation on every rank, as DALI's shuffle_after_epoch
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch))
        lo, hi = self.rank * self.n // self.world, (self.rank + 1) * self.n // self.world
        idx = order[lo:hi].tolist()
        if self.policy == LastBatchPolicy.DROP:
            keep = (self.n // self.world) // self.batch_size * self.batch_size
            idx = idx[:keep]
        return idx[self.skip:]

    def __iter__(self):
        return iter(self.indices())

    def __len__(self) -> int:
        return len(self.indices())


class NativeLoader:
    """A ``DataLoader`` over a ``ShardSampler``, with the loader contract: each ``for`` is the next
    epoch (a new permutation for train), and ``state_dict`` records the epoch and the batches
    consumed, so a restored loader resumes the same order mid-epoch (augmentation inside the
    DataLoader's workers is not restored: it follows torch's worker seeding)."""

    def __init__(self, loader: torch.utils.data.DataLoader, sampler: ShardSampler, *, num_classes: int,
                 source, postprocess: Callable[[tuple], tuple] | None = None) -> None:
        self.loader, self.sampler, self.source = loader, sampler, source
        self.num_classes, self.batch_size = num_classes, loader.batch_size
        self._post = postprocess or (lambda batch: tuple(batch))
        self._consumed = 0

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self._consumed += 1
            yield self._post(batch)
        self.sampler.epoch += 1
        self.sampler.skip, self._consumed = 0, 0

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "batches": self._consumed}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.epoch, self._consumed = int(state["epoch"]), int(state.get("batches", 0))
        self.sampler.skip = self._consumed * self.batch_size


class SyntheticBatches:
    """One batch of tensors, repeated: the upper bound a training loop reaches with free input
    (``--data-backend synthetic``), with the loader contract of the real loaders. ``sizes`` are the
    batch sizes of an epoch (``crossdali.common.loading.epochs.batch_sizes``: the data loaders' own, short last
    batch included, so its epoch has the same steps as theirs: a short last step costs a run its
    share of the speed, so a comparison against always-full batches would flatter synthetic data)."""

    def __init__(self, batch: tuple[torch.Tensor, ...], *, sizes: list[int], num_classes: int) -> None:
        self.batch, self.batch_size, self.num_classes = batch, batch[0].shape[0], num_classes
        self.sizes, self.epoch = list(sizes) or [self.batch_size], 0

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for n in self.sizes:
            yield self.batch if n == self.batch_size else tuple(t[:n] for t in self.batch)
        self.epoch += 1

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])


class _FileDataset(torch.utils.data.Dataset):
    """The DataSource's files decoded by torchvision (libjpeg-turbo), then the preset; ``hwc``: each
    image as its (H, W, C) view, so that the DataLoader's collate stacks an NHWC batch (channels last)."""

    def __init__(self, source: DataSource, transform, *, hwc: bool = False) -> None:
        self.files, self.labels, self.transform, self.hwc = source.files, source.labels, transform, hwc

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from torchvision.io import ImageReadMode, decode_image

        try:
            img = decode_image(self.files[i], mode=ImageReadMode.RGB)
        except RuntimeError as e:
            raise DataError(f"{self.files[i]} cannot be decoded ({e}); re-encode or remove it") from e
        image = self.transform(img)
        return (image.permute(1, 2, 0) if self.hwc else image), self.labels[i]


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
    pipelines: int = 1,
    prefetch_queue_depth: int = 2,
    channels_last: bool = False,
    auto_augment: str = "none",
    global_order: bool = False,
):
    """PyTorch ``(images, labels)`` batches of the train or val split of ``data``, from any backend.

    Every backend follows the epoch rule of ``crossdali.common.loading.epochs`` and returns a
    ``crossdali.common.loading.loaders.Loader``; images are ``(N, 3, H, W)`` float, labels ``(N,)`` int64.

    Args:
        data: a dataset folder (ImageFolder with ``train/`` and ``val/``, TFRecord, RecordIO,
            WebDataset or a file list; see ``crossdali.common.data.sources.resolve_source``) or an
            already resolved ``DataSource``.
        train: the train split (shuffled, augmented) or the val split (every sample once).
        backend: ``dali-gpu``, ``dali-cpu``, ``native`` (torchvision and a DataLoader) or ``synthetic``.
        batch_size: samples per batch on this rank.
        crop_size: side of the square output images.
        workers: DALI's threads, or the DataLoader's worker processes (``native``).
        seed: shuffle and augmentation seed: the same seed gives the same batches.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        data_format: ``auto`` or one of the layouts ``resolve_source`` reads.
        dtype: ``float32`` or ``float16`` images, in every backend.
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch (mid-epoch resume).
        pipelines: DALI backends: this rank's shard split over that many pipelines merged into each
            batch, as in ``crossdali.pytorch.create_video_loader``. More than one helps where the loader
            is the bottleneck; 1 stays the default because the model then gets more of the GPU
            (docs/benchmarks.md#classification-loaders). A mid-epoch checkpoint resumes only with the
            count it was saved with.
        prefetch_queue_depth: DALI backends: batches prepared ahead of the one in use (DALI's default,
            2). It changes how much jitter in DALI's speed the queue absorbs, never the batches.
        channels_last: the images in torch's channels-last memory format (same shape and values), what
            a model converted with ``model.to(memory_format=torch.channels_last)`` computes in. DALI
            writes NHWC and the batch is its view, so no copy is made.
        auto_augment: the train pipeline's augmentation policy (``crossdali.common.augment``: ``none``,
            ``autoaugment``, ``randaugment``, ``trivialaugment``), the same pixels in every framework for a
            given seed; DALI backends only.
        global_order: train in one order of the whole dataset per epoch that depends on ``seed`` and the
            epoch only, not on the number of ranks, so a mid-epoch ``state_dict`` resumes on another number
            (``resume_from_ranks``; ``crossdali.common.loading.global_order``). DALI backends, image files.

    Returns:
        A ``Loader``: ``for images, labels in loader`` is one epoch, the next ``for`` the next one.
    """
    plan = prepare_split(data, train=train, backend=backend, backends=BACKENDS, source_type=DataSource,
                         resolve=lambda d, split: resolve_source(d, split, format=data_format),
                         batch_size=batch_size, dist=dist, last_batch=last_batch, pipelines=pipelines)
    source, dist = plan.source, plan.dist
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype, output_layout="HWC" if channels_last else "CHW",
                                        auto_augment=check_auto_augment(auto_augment, backend=backend))
    if global_order and train and backend not in DALI_BACKENDS:
        raise UsageError(f"--global-order is an order of DALI's pipeline; the {backend!r} backend (--data-backend) has "
                         "its own: use dali-gpu or dali-cpu, or leave out --global-order")

    if backend == "synthetic":
        on_gpu = torch.cuda.is_available()
        device = torch.device("cuda", dist.gpu_id(device_id, visible_gpus=torch.cuda.device_count())) if on_gpu \
            else torch.device("cpu")
        g = torch.Generator().manual_seed(0)
        images = torch.randn((batch_size, 3, crop_size, crop_size), generator=g)
        labels = torch.randint(0, max(1, source.num_classes), (batch_size,), generator=g)
        images = images.to(device=device, dtype=torch.float16 if dtype == "float16" else torch.float32,
                           memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        return SyntheticBatches((images, labels.to(device)), num_classes=source.num_classes, sizes=plan.batch_sizes)
    if backend == "native":
        from crossdali.pytorch.presets import ClassificationPresetEval, ClassificationPresetTrain

        if not source.files:
            raise DataError(f"the native PyTorch backend reads image files; {source.root} holds {source.format} "
                            "records. Use --data-backend dali-cpu/dali-gpu, or point --data at an ImageFolder.")
        preset = (ClassificationPresetTrain if train else ClassificationPresetEval)(transform=transform)
        sampler = ShardSampler(source.num_samples, rank=dist.rank, world=dist.world_size, shuffle=train,
                               seed=seed, batch_size=batch_size, policy=plan.policy)
        loader = torch.utils.data.DataLoader(
            _FileDataset(source, preset, hwc=channels_last), batch_size=batch_size, sampler=sampler, num_workers=workers,
            pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
            drop_last=plan.policy == LastBatchPolicy.DROP)
        return NativeLoader(loader, sampler, num_classes=source.num_classes, source=source,
                            postprocess=lambda b: (b[0].permute(0, 3, 1, 2) if channels_last else b[0],
                                                   b[1].view(-1).long()))

    require_cuda(backend)
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, hw_decoder_load=hw_decoder_load,
                                    checkpointing=checkpointing, prefetch_queue_depth=prefetch_queue_depth,
                                    global_order=global_order and train)
    return DALILoader(plan, options,
                      lambda opts: create_classification_pipeline(source, train=train, options=opts, transform=transform),
                      names=("images", "labels"), reader_name=READER_NAME, channels_last=channels_last,
                      explain=lambda e: explain_decode_failure(source, e))
