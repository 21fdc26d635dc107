"""``create_detection_loader``: SSD300 batches in torch from DALI (GPU or CPU) or the native baseline.

train batches: ``(images (N, 3, 300, 300) float, offsets (N, 8732, 4) float, labels (N, 8732) int64)``
               -- DALI's ``box_encoder`` output, which ``crossdali.detection_ssd.MultiBoxLoss`` takes.
val batches:   ``(images, boxes (N, M, 4) ltrb relative, labels (N, M) int64 with 0 = padding,
               image_ids (N,) int64)`` -- for COCO evaluation.

``native`` is the baseline a PyTorch user writes today: ``decode_image`` + ``torchvision.transforms.v2``
on ``tv_tensors.BoundingBoxes`` (RandomZoomOut, RandomIoUCrop, Resize, RandomHorizontalFlip,
ColorJitter, SanitizeBoundingBoxes) in a ``DataLoader``, with the same ranges as the DALI pipeline
and boxes encoded by ``BoxCoder`` (the same matching rule as DALI's ``box_encoder``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from crossdali.common.classification import PipelineOptions
from crossdali.common.detection import (
    DEBUG_OUTPUTS,
    READER_NAME,
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    DetectionSource,
    DetectionTransform,
    create_detection_pipeline,
    resolve_detection_source,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.epochs import LastBatchPolicy, batches_per_epoch, choose_last_batch_policy, log_epoch_plan
from crossdali.common.sources import DataError

__all__ = ["DETECTION_BACKENDS", "create_detection_loader", "DALIDetectionLoader", "NativeDetectionDataset"]

log = logging.getLogger(__name__)

DETECTION_BACKENDS = ("dali-gpu", "dali-cpu", "native")


class DALIDetectionLoader:
    """DALI's PyTorch iterator over the shared detection pipeline: plain tuples, empty batches skipped."""

    def __init__(self, source: DetectionSource, *, train: bool, options: PipelineOptions,
                 transform: DetectionTransform, policy: LastBatchPolicy, debug: bool = False) -> None:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator  # defer: DALI's torch plugin

        self.source, self.batch_size, self.policy = source, options.batch_size, policy
        self.num_classes = source.num_classes
        self.names = (TRAIN_OUTPUTS + (DEBUG_OUTPUTS if debug else ())) if train else VAL_OUTPUTS
        self._len = batches_per_epoch(source.num_images, batch_size=options.batch_size,
                                      num_shards=options.num_shards, policy=policy)
        pipe = create_detection_pipeline(source, train=train, options=options, transform=transform, debug=debug)
        self._iter = DALIGenericIterator([pipe], list(self.names), reader_name=READER_NAME,
                                         last_batch_policy=policy, auto_reset=True)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for batch in self._iter:
            out = batch[0]
            if out["images"].shape[0] == 0:
                continue  # a shard shorter than the longest one ends with an empty batch
            if "image_ids" in out:
                out["image_ids"] = out["image_ids"].view(-1)
            yield tuple(out[n] for n in self.names)


def _read_coco(source: DetectionSource) -> list[tuple[Path, int, list, list]]:
    """``(file, image_id, boxes xyxy pixels, labels 1..C)`` per image, the reader's rules applied."""
    coco = json.loads(source.annotations_file.read_text(encoding="utf-8"))
    label_of = {cid: i + 1 for i, (cid, _) in enumerate(source.categories)}
    per_image: dict[int, tuple[list, list]] = {im["id"]: ([], []) for im in coco["images"]}
    for a in coco["annotations"]:
        if a.get("iscrowd", 0):
            continue
        x, y, w, h = a["bbox"]
        if w < 0.1 or h < 0.1:  # readers.coco's size_threshold
            continue
        per_image[a["image_id"]][0].append([x, y, x + w, y + h])
        per_image[a["image_id"]][1].append(label_of[a["category_id"]])
    items = []
    for im in coco["images"]:
        boxes, labels = per_image[im["id"]]
        if boxes or not source.skip_empty:
            items.append((source.file_root / im["file_name"], im["id"], boxes, labels))
    return items


class NativeDetectionDataset(torch.utils.data.Dataset):
    """COCO images decoded by torchvision, augmented with v2 transforms on BoundingBoxes."""

    def __init__(self, source: DetectionSource, *, train: bool, transform: DetectionTransform | None = None) -> None:
        from torchvision.transforms import v2

        from crossdali.detection_ssd.model import BoxCoder

        t = transform or DetectionTransform()
        self.items, self.train, self.size = _read_coco(source), train, t.size
        self.coder = BoxCoder(match_iou=t.match_iou)
        normalize = [v2.ToDtype(torch.float32, scale=True),
                     v2.Normalize(mean=[m / 255 for m in t.mean], std=[s / 255 for s in t.std])]
        resize = v2.Resize((t.size, t.size), antialias=True)
        if train:
            self.transforms = v2.Compose([
                v2.RandomZoomOut(fill={"image": t.fill, "others": 0}, side_range=(1.0, t.max_zoom_out),
                                 p=t.zoom_out_probability),
                v2.RandomIoUCrop(min_scale=t.crop_scaling[0], max_scale=t.crop_scaling[1],
                                 min_aspect_ratio=t.crop_aspect_ratio[0], max_aspect_ratio=t.crop_aspect_ratio[1],
                                 sampler_options=[*t.iou_thresholds, 1.0], trials=50),
                resize,
                v2.RandomHorizontalFlip(t.flip_probability),
                v2.ColorJitter(brightness=t.brightness[1] - 1, contrast=t.contrast[1] - 1,
                               saturation=t.saturation[1] - 1, hue=t.hue_degrees / 360),
                v2.SanitizeBoundingBoxes(),  # drops boxes under 1 px (DALI keeps >= 0.1 px)
                *normalize,
            ])
        else:
            self.transforms = v2.Compose([resize, *normalize])

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        from torchvision import tv_tensors
        from torchvision.io import ImageReadMode, decode_image

        path, image_id, boxes, labels = self.items[i]
        try:
            img = decode_image(str(path), mode=ImageReadMode.RGB)
        except RuntimeError as e:
            raise DataError(f"{path} cannot be decoded ({e}); re-encode or remove it") from e
        h, w = img.shape[-2:]
        sample = {"image": tv_tensors.Image(img),
                  "boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                                                    format="XYXY", canvas_size=(h, w)),
                  "labels": torch.tensor(labels, dtype=torch.int64)}
        out = self.transforms(sample)
        rel = out["boxes"].as_subclass(torch.Tensor) / self.size
        if self.train:
            offsets, anchor_labels = self.coder.encode(rel, out["labels"])
            return out["image"].as_subclass(torch.Tensor), offsets, anchor_labels
        return out["image"].as_subclass(torch.Tensor), rel, out["labels"], image_id


def _collate_val(batch):
    images = torch.stack([b[0] for b in batch])
    m = max(1, max(len(b[2]) for b in batch))
    boxes = torch.zeros(len(batch), m, 4)
    labels = torch.zeros(len(batch), m, dtype=torch.int64)
    for i, b in enumerate(batch):
        boxes[i, : len(b[2])], labels[i, : len(b[2])] = b[1], b[2]
    return images, boxes, labels, torch.tensor([b[3] for b in batch], dtype=torch.int64)


class _NativeLoader:
    def __init__(self, loader, source: DetectionSource) -> None:
        self.loader, self.source, self.num_classes = loader, source, source.num_classes
        self.batch_size = loader.batch_size

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return iter(self.loader)


def create_detection_loader(
    data: str | Path | DetectionSource,
    *,
    train: bool,
    backend: str = "dali-cpu",
    batch_size: int = 32,
    workers: int = 4,
    seed: int = 0,
    dist: DistInfo | None = None,
    device_id: int | None = None,
    hw_decoder_load: float = 1.0,
    transform: DetectionTransform | None = None,
    last_batch: str | None = None,
    debug: bool = False,
):
    """An iterable of SSD300 train or val batches (see the module docstring) over a COCO-format folder.

    ``data`` is a folder with ``annotations/instances_{train,val}.json`` and ``{train,val}/`` (or a
    resolved ``DetectionSource``). ``dist`` shards by the global rank; ``workers`` is DALI's thread
    count or the DataLoader's worker count. The result has ``len()``, ``batch_size``, ``num_classes``
    and ``source``. ``debug`` (DALI train only) adds ``DEBUG_OUTPUTS`` to each batch.
    """
    if backend not in DETECTION_BACKENDS:
        raise ValueError(f"backend must be one of {DETECTION_BACKENDS}, got {backend!r}")
    dist = dist or DistInfo()
    split = "train" if train else "val"
    source = data if isinstance(data, DetectionSource) else resolve_detection_source(data, split)
    transform = transform or DetectionTransform()
    policy = choose_last_batch_policy(train=train, num_shards=dist.world_size, policy=last_batch)
    if dist.is_main:
        log_epoch_plan(f"detection {split} ({backend}, {source.annotations_file})", source.num_images,
                       batch_size=batch_size, num_shards=dist.world_size, policy=policy)
    if backend == "native":
        from crossdali.pytorch.loaders import _ShardSampler  # the sharding rule of the classification loader

        dataset = NativeDetectionDataset(source, train=train, transform=transform)
        sampler = _ShardSampler(len(dataset), rank=dist.rank, world=dist.world_size, shuffle=train, seed=seed,
                                batch_size=batch_size, policy=policy)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(), drop_last=policy == LastBatchPolicy.DROP,
            collate_fn=None if train else _collate_val)
        return _NativeLoader(loader, source)
    device = "gpu" if backend == "dali-gpu" else "cpu"
    if device == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("--data-backend dali-gpu needs a CUDA GPU and none is visible; use dali-cpu")
    options = PipelineOptions(
        batch_size=batch_size, device=device,
        device_id=(device_id if device_id is not None else dist.local_rank) if device == "gpu" else None,
        num_threads=max(1, workers), seed=seed, shard_id=dist.rank, num_shards=dist.world_size,
        hw_decoder_load=hw_decoder_load)
    return DALIDetectionLoader(source, train=train, options=options, transform=transform, policy=policy,
                               debug=debug and train)
