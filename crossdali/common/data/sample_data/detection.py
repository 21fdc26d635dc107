"""Detection sample set: objects cut from real photos, pasted on real backgrounds, exact boxes.

Every image is a random crop of a background texture (grass, gravel, brick, moon) with 1-4
non-overlapping objects pasted on it; each object is a whole photo (astronaut, cat, coffee cup,
rocket, motorcycle) rescaled with a little aspect jitter, so its box is exactly the pasted
rectangle. Written in COCO's layout, which ``fn.readers.coco`` and pycocotools read:

    detection/{train,val}/<nnnnnn>.jpg
    detection/annotations/instances_{train,val}.json

Category ids are not contiguous (as in COCO, whose 80 classes use ids 1-90), so code that maps
ids to training labels and back is exercised. Deterministic given the seed and Pillow's libjpeg.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from crossdali.common.data.sample_data.photos import BACKGROUND_PHOTOS, load_photo

__all__ = ["DetectionSampleConfig", "DETECTION_SIZES", "CATEGORIES", "build_detection", "ensure_detection"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val")

#: (COCO category id, name, photo). Ids have gaps on purpose (see the module docstring).
CATEGORIES: tuple[tuple[int, str, str], ...] = (
    (1, "astronaut", "astronaut.png"),
    (3, "cat", "chelsea.png"),
    (5, "coffee", "coffee.png"),
    (8, "rocket", "rocket.jpg"),
    (13, "motorcycle", "motorcycle_left.png"),
)


@dataclass(frozen=True)
class DetectionSampleConfig:
    """How many images, how large, how many objects. ``DETECTION_SIZES`` holds the presets."""

    train_images: int = 256
    val_images: int = 64
    min_side: int = 256
    max_side: int = 352
    max_objects: int = 4
    min_object: float = 0.18  # object box side as a fraction of the image's shorter side
    max_object: float = 0.5
    quality: tuple[int, int] = (80, 95)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_images", "val_images", "min_side", "max_side", "max_objects"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.min_side > self.max_side:
            raise ValueError(f"min_side ({self.min_side}) must not exceed max_side ({self.max_side})")
        if not 0 < self.min_object <= self.max_object < 1:
            raise ValueError(f"need 0 < min_object <= max_object < 1, got {self.min_object}, {self.max_object}")

    def count(self, split: str) -> int:
        return self.train_images if split == "train" else self.val_images


#: ``tiny`` for CI on 2 cores; ``bench`` is 4,096 COCO-style JPEGs of ~70 KB for the GPU benchmarks
#: (docs/benchmarks.md#detection-loaders).
DETECTION_SIZES: dict[str, DetectionSampleConfig] = {
    "tiny": DetectionSampleConfig(train_images=96, val_images=24, min_side=192, max_side=256),
    "small": DetectionSampleConfig(),
    "bench": DetectionSampleConfig(train_images=4096, val_images=64, min_side=480, max_side=640, quality=(78, 88)),
}


def _place(rng: np.random.Generator, w: int, h: int, boxes: list, bw: int, bh: int):
    """A position for a ``bw`` x ``bh`` box that overlaps none of ``boxes`` (None if 30 tries fail)."""
    for _ in range(30):
        x, y = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        if all(x + bw <= bx or bx + bbw <= x or y + bh <= by or by + bbh <= y for bx, by, bbw, bbh in boxes):
            return x, y
    return None


def _make_image(key: tuple[int, int], cfg: DetectionSampleConfig) -> tuple[bytes, int, int, list]:
    """One JPEG and its ``(category_id, [x, y, w, h])`` objects, from a per-image random stream."""
    split_id, index = key
    rng = np.random.default_rng([cfg.seed, 7, split_id, index])
    short = int(rng.integers(cfg.min_side, cfg.max_side + 1))
    aspect = float(rng.uniform(1.0, 1.5))
    w, h = (round(short * aspect), short) if rng.random() < 0.7 else (short, round(short * aspect))
    bg = load_photo(BACKGROUND_PHOTOS[int(rng.integers(len(BACKGROUND_PHOTOS)))])
    bh_, bw_ = bg.shape[:2]
    scale = max(w / bw_, h / bh_) * float(rng.uniform(1.0, 1.6))
    bg_img = Image.fromarray(bg).resize((max(w, round(bw_ * scale)), max(h, round(bh_ * scale))), Image.BILINEAR)
    x0 = int(rng.integers(0, bg_img.width - w + 1))
    y0 = int(rng.integers(0, bg_img.height - h + 1))
    canvas = bg_img.crop((x0, y0, x0 + w, y0 + h))
    objects, boxes = [], []
    for _ in range(int(rng.integers(1, cfg.max_objects + 1))):
        cat_id, _, photo_name = CATEGORIES[int(rng.integers(len(CATEGORIES)))]
        photo = load_photo(photo_name)
        ph, pw = photo.shape[:2]
        side = rng.uniform(cfg.min_object, cfg.max_object) * min(w, h)
        obj_aspect = pw / ph * float(np.exp(rng.uniform(-0.15, 0.15)))
        ow, oh = max(8, round(side * obj_aspect**0.5)), max(8, round(side / obj_aspect**0.5))
        ow, oh = min(ow, w - 1), min(oh, h - 1)
        pos = _place(rng, w, h, boxes, ow, oh)
        if pos is None:
            continue
        obj = Image.fromarray(photo).resize((ow, oh), Image.BILINEAR)
        canvas.paste(obj, pos)
        boxes.append((pos[0], pos[1], ow, oh))
        objects.append((cat_id, [pos[0], pos[1], ow, oh]))
    arr = np.asarray(canvas, dtype=np.float32) * rng.uniform(0.9, 1.1, size=3)
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(
        buf, format="JPEG", quality=int(rng.integers(cfg.quality[0], cfg.quality[1] + 1)))
    return buf.getvalue(), w, h, objects


def _images(split: str, cfg: DetectionSampleConfig):
    keys = [(SPLITS.index(split), i) for i in range(cfg.count(split))]
    if len(keys) < 500:
        yield from (_make_image(k, cfg) for k in keys)
        return
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        yield from pool.map(functools.partial(_make_image, cfg=cfg), keys, chunksize=32)


def build_detection(root: Path, cfg: DetectionSampleConfig, *, force: bool = False) -> Path:
    """Build the detection sample set under ``root/detection``; return that folder.

    Reused when a set with the same config exists; written to a temporary folder and renamed
    into place, so an interrupted build is never reused.
    """
    out = Path(root) / "detection"
    manifest_path = out / "manifest.json"
    if not force and manifest_path.is_file():
        try:
            if json.loads(manifest_path.read_text())["config"] == json.loads(json.dumps(asdict(cfg))):
                return out
        except (ValueError, KeyError):
            pass  # unreadable manifest: rebuild
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "annotations").mkdir(parents=True)
    categories = [{"id": cid, "name": name, "supercategory": "object"} for cid, name, _ in CATEGORIES]
    counts = {}
    for split in SPLITS:
        (tmp / split).mkdir()
        images, annotations = [], []
        for i, (jpeg, w, h, objects) in enumerate(_images(split, cfg)):
            name = f"{i:06d}.jpg"
            (tmp / split / name).write_bytes(jpeg)
            image_id = i + 1
            images.append({"id": image_id, "file_name": name, "width": w, "height": h})
            for cat_id, (x, y, bw, bh) in objects:
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cat_id,
                                    "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})
        coco = {"info": {"description": f"crossdali detection sample ({split})"}, "images": images,
                "annotations": annotations, "categories": categories}
        (tmp / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco))
        counts[split] = {"images": len(images), "objects": len(annotations)}
        log.info("detection %s: %d images, %d objects", split, len(images), len(annotations))
    (tmp / "manifest.json").write_text(json.dumps({"config": asdict(cfg), "counts": counts}, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def ensure_detection(root: Path | None = None, size: str = "small") -> Path:
    """Build the detection sample set of the named ``size`` if missing; return its folder."""
    from crossdali.common.data.sample_data import default_root  # late: avoids an import cycle

    if size not in DETECTION_SIZES:
        raise ValueError(f"unknown sample size {size!r}; choose one of {sorted(DETECTION_SIZES)}")
    root = Path(root) if root is not None else default_root()
    return build_detection(root / size, DETECTION_SIZES[size])
