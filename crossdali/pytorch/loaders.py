"""``create_classification_loader``: (images, labels) torch batches from any backend.

Backends, chosen by name (DeepLearningExamples' ``--data-backend``):

- ``dali-gpu``: the shared DALI pipeline with the mixed (GPU / hardware JPEG) decoder; tensors
  arrive on ``cuda:<device_id>``.
- ``dali-cpu``: the same pipeline entirely on the CPU (no GPU needed); tensors on the CPU.
- ``native``: torchvision ``decode_image`` + the v2 preset in a ``DataLoader`` (the baseline).
- ``synthetic``: one random batch repeated, to measure the model without any input pipeline.

Every backend yields ``images`` (N, C, H, W) float and ``labels`` (N,) int64 and honours the
same epoch rules (``crossdali.common.epochs``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import torch

from crossdali.common.classification import (
    READER_NAME,
    ClassificationTransform,
    PipelineOptions,
    create_classification_pipeline,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.epochs import LastBatchPolicy, batches_per_epoch, choose_last_batch_policy, log_epoch_plan
from crossdali.common.sources import DataError, DataSource, explain_decode_failure, resolve_source

__all__ = ["BACKENDS", "create_classification_loader", "DALIClassificationLoader"]

log = logging.getLogger(__name__)

BACKENDS = ("dali-gpu", "dali-cpu", "native", "synthetic")


class DALIClassificationLoader:
    """Wraps DALI's PyTorch iterator: plain ``(images, labels)`` tuples, empty batches skipped,
    decoder failures turned into errors that name the file."""

    def __init__(self, source: DataSource, *, train: bool, options: PipelineOptions,
                 transform: ClassificationTransform, policy: LastBatchPolicy) -> None:
        from nvidia.dali.plugin.pytorch import DALIClassificationIterator  # defer: DALI's torch plugin

        self.source = source
        self.batch_size = options.batch_size
        self.num_classes = source.num_classes
        self.policy = policy
        self._len = batches_per_epoch(source.num_samples, batch_size=options.batch_size,
                                      num_shards=options.num_shards, policy=policy)
        pipe = create_classification_pipeline(source, train=train, options=options, transform=transform)
        self._iter = DALIClassificationIterator([pipe], reader_name=READER_NAME,
                                                last_batch_policy=policy, auto_reset=True)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        it = iter(self._iter)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except RuntimeError as e:
                raise explain_decode_failure(self.source, e) from e
            images, labels = batch[0]["data"], batch[0]["label"]
            if images.shape[0] == 0:
                continue  # a shard shorter than the longest one ends with an empty batch
            yield images, labels.view(-1)


class _FileDataset(torch.utils.data.Dataset):
    """The DataSource's files decoded by torchvision (libjpeg-turbo), then the preset."""

    def __init__(self, source: DataSource, transform) -> None:
        self.files, self.labels, self.transform = source.files, source.labels, transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from torchvision.io import ImageReadMode, decode_image

        try:
            img = decode_image(self.files[i], mode=ImageReadMode.RGB)
        except RuntimeError as e:
            raise DataError(f"{self.files[i]} cannot be decoded ({e}); re-encode or remove it") from e
        return self.transform(img), self.labels[i]


class _ShardSampler(torch.utils.data.Sampler):
    """Contiguous shard ``rank`` of ``world``, shuffled per epoch when training.

    Written here because torch's DistributedSampler pads shards with duplicates (drop_last=False)
    or drops samples (drop_last=True); this one matches DALI's sharding instead: val sees every
    sample exactly once across ranks, train under several ranks drops to equal batch counts.
    """

    def __init__(self, n: int, *, rank: int, world: int, shuffle: bool, seed: int,
                 batch_size: int, policy: LastBatchPolicy) -> None:
        self.n, self.rank, self.world, self.shuffle, self.seed = n, rank, world, shuffle, seed
        self.batch_size, self.policy, self.epoch = batch_size, policy, 0

    def _indices(self) -> list[int]:
        order = torch.arange(self.n)
        if self.shuffle:  # the same global permutation on every rank, as DALI's shuffle_after_epoch
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        lo, hi = self.rank * self.n // self.world, (self.rank + 1) * self.n // self.world
        idx = order[lo:hi].tolist()
        if self.policy == LastBatchPolicy.DROP:
            keep = (self.n // self.world) // self.batch_size * self.batch_size
            idx = idx[:keep]
        return idx

    def __iter__(self):
        idx = self._indices()
        self.epoch += 1
        return iter(idx)

    def __len__(self) -> int:
        return len(self._indices())


class _SyntheticLoader:
    """One random batch, repeated: the upper bound a training loop reaches with free input."""

    def __init__(self, *, num_samples: int, batch_size: int, crop_size: int, num_classes: int,
                 channels_last: bool, device: torch.device, dtype: torch.dtype) -> None:
        g = torch.Generator().manual_seed(0)
        shape = (batch_size, crop_size, crop_size, 3) if channels_last else (batch_size, 3, crop_size, crop_size)
        self.images = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        if channels_last:
            self.images = self.images.permute(0, 3, 1, 2)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
        self.batch_size, self.num_classes = batch_size, num_classes
        self._len = math.ceil(num_samples / batch_size)

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        for _ in range(self._len):
            yield self.images, self.labels


class _NativeLoader:
    def __init__(self, loader: torch.utils.data.DataLoader, num_classes: int, batch_size: int) -> None:
        self.loader, self.num_classes, self.batch_size = loader, num_classes, batch_size

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for images, labels in self.loader:
            yield images, labels.view(-1).long()


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
):
    """An iterable of ``(images, labels)`` for the train or val split of ``data``.

    ``data`` is a dataset folder (ImageFolder with train/ and val/, or TFRecord / RecordIO / file
    list, see ``crossdali.common.sources.resolve_source``) or an already resolved ``DataSource``.
    ``workers`` is DALI's thread count or the DataLoader's worker count. ``dist`` shards by the
    global rank (default: one process). ``device_id`` is the GPU for ``dali-gpu`` (default: the
    local rank). ``last_batch`` overrides the epoch rule ('partial' | 'drop').
    The result has ``len()`` (batches per epoch), ``batch_size`` and ``num_classes``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if isinstance(data, DataSource) else resolve_source(data, split, format=data_format)
    transform = ClassificationTransform(crop_size=crop_size, dtype=dtype)
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    if dist.is_main:
        log_epoch_plan(f"{split} ({backend}, {source.format} at {source.root})", source.num_samples,
                       batch_size=batch_size, num_shards=dist.world_size, policy=policy)

    if backend == "synthetic":
        on_gpu = torch.cuda.is_available()
        device = torch.device("cuda", device_id if device_id is not None else dist.local_rank) if on_gpu else torch.device("cpu")
        per_shard = source.num_samples // dist.world_size
        return _SyntheticLoader(num_samples=per_shard, batch_size=batch_size, crop_size=crop_size,
                                num_classes=source.num_classes, channels_last=False, device=device,
                                dtype=torch.float16 if dtype == "float16" else torch.float32)
    if backend == "native":
        from crossdali.pytorch.presets import ClassificationPresetEval, ClassificationPresetTrain

        if not source.files:
            raise DataError(f"the native PyTorch backend reads image files; {source.root} holds {source.format} "
                            "records. Use --data-backend dali-cpu/dali-gpu, or point --data at an ImageFolder.")
        preset = (ClassificationPresetTrain if train else ClassificationPresetEval)(transform=transform)
        sampler = _ShardSampler(source.num_samples, rank=dist.rank, world=dist.world_size, shuffle=train,
                                seed=seed, batch_size=batch_size, policy=policy)
        loader = torch.utils.data.DataLoader(
            _FileDataset(source, preset), batch_size=batch_size, sampler=sampler, num_workers=workers,
            pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
            drop_last=policy == LastBatchPolicy.DROP)
        return _NativeLoader(loader, source.num_classes, batch_size)

    device = "gpu" if backend == "dali-gpu" else "cpu"
    if device == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("--data-backend dali-gpu needs a CUDA GPU and none is visible; use dali-cpu")
    options = PipelineOptions(
        batch_size=batch_size, device=device,
        device_id=(device_id if device_id is not None else dist.local_rank) if device == "gpu" else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size,
        hw_decoder_load=hw_decoder_load)
    return DALIClassificationLoader(source, train=train, options=options, transform=transform, policy=policy)
