"""Classification sample set: one class per real photo, samples are random crops of it.

Every sample is a random crop (10-50 % of the photo's area), rescaled and colour-shifted, then
JPEG-encoded with a random quality. The same samples, in the same order, are written as

    imagefolder/{train,val}/<class>/<nnnn>.jpg   (+ imagefolder/{train,val}.txt file lists)
    tfrecord/{train,val}.tfrecord                (+ .idx, DALI's index)
    recordio/{train,val}.rec                     (+ .idx, MXNet's index)
    webdataset/{train,val}-<nnnnnn>.tar          (+ .idx, DALI's wds2idx index; 256 samples a shard)

The order is the one ``fn.readers.file`` enumerates an ImageFolder in (classes sorted, then file
names sorted), so every reader sees sample ``i`` as the same JPEG bytes. Deterministic given
the seed and the Pillow version (JPEG bytes come from Pillow's libjpeg).
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

from crossdali.common.data.sample_data.formats import write_recordio, write_tfrecord, write_webdataset
from crossdali.common.data.sample_data.photos import CLASS_PHOTOS, load_photo

__all__ = ["ClassificationSampleConfig", "SIZES", "build_classification", "class_names"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val")


@dataclass(frozen=True)
class ClassificationSampleConfig:
    """How many samples and how large. ``SIZES`` holds the named presets."""

    train_per_class: int = 48
    val_per_class: int = 11
    min_side: int = 160
    max_side: int = 288
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_per_class", "val_per_class", "min_side", "max_side"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.min_side > self.max_side:
            raise ValueError(f"min_side ({self.min_side}) must not exceed max_side ({self.max_side})")

    def count(self, split: str) -> int:
        per_class = self.train_per_class if split == "train" else self.val_per_class
        return per_class * len(CLASS_PHOTOS)


#: Named sizes. ``tiny`` keeps CI fast on 2 cores; ``bench`` is 8,192 JPEGs of about 84 KB, close
#: to ImageNet's average file, for the GPU benchmarks (docs/benchmarks.md#classification-loaders).
SIZES: dict[str, ClassificationSampleConfig] = {
    "tiny": ClassificationSampleConfig(train_per_class=24, val_per_class=5, min_side=96, max_side=160),
    "small": ClassificationSampleConfig(),
    "bench": ClassificationSampleConfig(train_per_class=745, val_per_class=11, min_side=500, max_side=700),
}


def class_names() -> list[str]:
    """Class folder names, in label order."""
    return [Path(p).stem for p in CLASS_PHOTOS]


def _make_sample(photo: np.ndarray, rng: np.random.Generator, cfg: ClassificationSampleConfig) -> bytes:
    h, w = photo.shape[:2]
    area = rng.uniform(0.10, 0.50) * h * w
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    ch = int(min(h, round(np.sqrt(area / aspect))))
    cw = int(min(w, round(np.sqrt(area * aspect))))
    y = int(rng.integers(0, h - ch + 1))
    x = int(rng.integers(0, w - cw + 1))
    crop = photo[y : y + ch, x : x + cw].astype(np.float32)
    crop = crop * rng.uniform(0.85, 1.15, size=3) + rng.uniform(-15, 15)
    img = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8))
    short = int(rng.integers(cfg.min_side, cfg.max_side + 1))
    scale = short / min(ch, cw)
    img = img.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=int(rng.integers(80, 96)))
    return buf.getvalue()


def _one_sample(key: tuple[int, int, int], cfg: ClassificationSampleConfig) -> bytes:
    split_id, label, i = key
    rng = np.random.default_rng([cfg.seed, split_id, label, i])  # per-sample stream: order-free
    return _make_sample(load_photo(CLASS_PHOTOS[label]), rng, cfg)


def _samples(split: str, cfg: ClassificationSampleConfig):
    """``(label, index, jpeg)`` in reader order; large sets are encoded on every core."""
    per_class = cfg.train_per_class if split == "train" else cfg.val_per_class
    keys = [(SPLITS.index(split), label, i) for label in range(len(CLASS_PHOTOS)) for i in range(per_class)]
    if len(keys) < 1000:
        jpegs = (_one_sample(k, cfg) for k in keys)
        yield from ((k[1], k[2], j) for k, j in zip(keys, jpegs))
        return
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        jpegs = pool.map(functools.partial(_one_sample, cfg=cfg), keys, chunksize=64)
        yield from ((k[1], k[2], j) for k, j in zip(keys, jpegs))


FORMATS = ("imagefolder", "tfrecord", "recordio", "webdataset")


def build_classification(root: Path, cfg: ClassificationSampleConfig, *, formats: tuple[str, ...] = FORMATS,
                         force: bool = False) -> Path:
    """Build the classification sample set under ``root/classification``; return that folder.

    An existing set built with the same config and formats is reused (unless ``force``). The set
    is written to a temporary folder and renamed into place, so an interrupted build is never
    reused. ``formats`` may leave out the record formats (e.g. where ``tfrecord`` is not installed).
    """
    unknown = set(formats) - set(FORMATS)
    if unknown or "imagefolder" not in formats:
        raise ValueError(f"formats must include 'imagefolder' and be among {FORMATS}, got {formats}")
    out = Path(root) / "classification"
    manifest_path = out / "manifest.json"
    if not force and manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text())
            if manifest["config"] == asdict(cfg) and set(formats) <= set(manifest["formats"]):
                return out
        except (ValueError, KeyError):
            pass  # unreadable manifest: rebuild
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    names = class_names()
    counts = {}
    for split in SPLITS:
        samples = []
        lines = []
        for label, i, jpeg in _samples(split, cfg):
            rel = f"{split}/{names[label]}/{i:04d}.jpg"
            path = tmp / "imagefolder" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(jpeg)
            lines.append(f"{rel} {label}\n")
            samples.append((jpeg, label))
        (tmp / "imagefolder" / f"{split}.txt").write_text("".join(lines))
        if "tfrecord" in formats:
            (tmp / "tfrecord").mkdir(exist_ok=True)
            write_tfrecord(tmp / "tfrecord" / f"{split}.tfrecord", samples)
        if "recordio" in formats:
            (tmp / "recordio").mkdir(exist_ok=True)
            write_recordio(tmp / "recordio" / f"{split}.rec", samples)
        if "webdataset" in formats:
            (tmp / "webdataset").mkdir(exist_ok=True)
            write_webdataset(tmp / "webdataset", split, samples)
        counts[split] = len(samples)
        log.info("classification %s: %d samples", split, len(samples))
    manifest = {"config": asdict(cfg), "formats": list(formats), "classes": names, "counts": counts}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
