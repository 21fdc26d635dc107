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
from pathlib import Path

import torch

from crossdali.common.detection import (
    DEBUG_OUTPUTS,
    READER_NAME,
    TRAIN_OUTPUTS,
    VAL_OUTPUTS,
    DetectionSource,
    DetectionTransform,
    create_detection_pipeline,
    default_detection_pipelines,
    explain_detection_failure,
    resolve_detection_source,
)
from crossdali.common.distributed import DistInfo
from crossdali.common.errors import DataError
from crossdali.common.loading.epochs import LastBatchPolicy
from crossdali.common.loading.loaders import prepare_split
from crossdali.pytorch.boxes import BoxCoder
from crossdali.pytorch.loaders import DALILoader, NativeLoader, ShardSampler, require_cuda

__all__ = ["DETECTION_BACKENDS", "create_detection_loader", "NativeDetectionDataset"]

log = logging.getLogger(__name__)

DETECTION_BACKENDS = ("dali-gpu", "dali-cpu", "native")


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
    checkpointing: bool = True,
    pipelines: int | None = None,
):
    """PyTorch SSD300 train or val batches (see the module docstring) over a COCO-format dataset.

    Returns a loader with ``len()``, ``batch_size``, ``num_classes`` and ``source``.

    Args:
        data: a folder with ``annotations/instances_{train,val}.json`` and ``{train,val}/``, or a
            resolved ``DetectionSource``.
        train: the train split (SSD augmentation, encoded boxes) or val (resize, raw boxes, image ids).
        backend: ``dali-gpu``, ``dali-cpu`` or ``native`` (torchvision transforms in a DataLoader).
        batch_size: images per batch on this rank.
        workers: DALI's threads, or the DataLoader's worker processes (``native``).
        seed: shuffle and augmentation seed.
        dist: rank and world size to shard by (default: one process).
        device_id: the GPU of ``dali-gpu`` (default: the local rank).
        hw_decoder_load: share of the JPEGs sent to the GPU's hardware JPEG decoder, where it has one.
        transform: the augmentation ranges (default: SSD300's, ``DetectionTransform()``).
        last_batch: the epoch rule's last batch overridden: ``partial`` or ``drop``.
        debug: DALI train only: add ``DEBUG_OUTPUTS`` (the random parameters) to each batch.
        checkpointing: let ``state_dict()`` hold DALI's position inside an epoch.
        pipelines: DALI backends: this rank's shard split over that many pipelines merged into each
            batch, as in ``crossdali.pytorch.create_classification_loader`` (val's boxes and labels are
            padded to the longest of the merged batch). Default: 2 for training on ``dali-gpu`` where the
            batch splits evenly, else 1 (``default_detection_pipelines``; ``benchmarks/detection_loaders.py
            --pipelines`` measures what it gives: docs/benchmarks.md#detection-loaders). A mid-epoch
            checkpoint resumes only with the count it was saved with.
    """
    if pipelines is None:
        pipelines = default_detection_pipelines(backend, batch_size, train=train)
    plan = prepare_split(data, train=train, backend=backend, backends=DETECTION_BACKENDS,
                         source_type=DetectionSource, resolve=resolve_detection_source, batch_size=batch_size,
                         dist=dist, last_batch=last_batch, what="detection", pipelines=pipelines)
    source, dist = plan.source, plan.dist
    transform = transform or DetectionTransform()
    if backend == "native":
        dataset = NativeDetectionDataset(source, train=train, transform=transform)
        sampler = ShardSampler(len(dataset), rank=dist.rank, world=dist.world_size, shuffle=train, seed=seed,
                               batch_size=batch_size, policy=plan.policy)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(), drop_last=plan.policy == LastBatchPolicy.DROP,
            collate_fn=None if train else _collate_val)
        return NativeLoader(loader, sampler, num_classes=source.num_classes, source=source)
    require_cuda(backend)
    debug = debug and train
    options = plan.pipeline_options(workers=workers, seed=seed, device_id=device_id, hw_decoder_load=hw_decoder_load,
                                    checkpointing=checkpointing)
    names = (TRAIN_OUTPUTS + (DEBUG_OUTPUTS if debug else ())) if train else VAL_OUTPUTS
    return DALILoader(plan, options,
                      lambda opts: create_detection_pipeline(source, train=train, options=opts, transform=transform,
                                                             debug=debug),
                      names=names, reader_name=READER_NAME, flatten=("image_ids",),
                      explain=lambda e: explain_detection_failure(source, e))
