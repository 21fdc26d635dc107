"""Multi-label sample set: images that really show several classes.

Each image is a 2x2 grid on a noisy grey background with crops of 1 to 3 different class photos
in random cells (the classes of the classification sample set); its labels are those classes. The
list files use class names, the format ``crossdali.common.multilabel.read_multilabel_list`` reads:

    multilabel/images/{train,val}/<nnnnn>.jpg
    multilabel/{train,val}.txt     "images/train/00000.jpg coffee rocket" per line
    multilabel/classes.txt         the class names in label order

Deterministic given the seed (a random stream per image).
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from crossdali.common.data.sample_data.classification import class_names
from crossdali.common.data.sample_data.photos import CLASS_PHOTOS, load_photo

__all__ = ["MultiLabelSampleConfig", "MULTILABEL_SIZES", "build_multilabel"]


@dataclass(frozen=True)
class MultiLabelSampleConfig:
    train: int = 400
    val: int = 120
    side: int = 160  # the grid image is side x side, each cell side/2
    seed: int = 0


MULTILABEL_SIZES = {
    "tiny": MultiLabelSampleConfig(train=96, val=40, side=96),
    "small": MultiLabelSampleConfig(),
    "bench": MultiLabelSampleConfig(train=8000, val=500, side=448),
}


def _composite(rng: np.random.Generator, photos: list[np.ndarray], side: int) -> tuple[bytes, list[int]]:
    cell = side // 2
    canvas = rng.normal(128, 20, size=(side, side, 3))
    k = int(rng.integers(1, 4))
    labels = sorted(rng.choice(len(photos), size=k, replace=False).tolist())
    cells = rng.choice(4, size=k, replace=False)
    for label, c in zip(labels, cells):
        photo = photos[label]
        h, w = photo.shape[:2]
        s = int(min(h, w) * rng.uniform(0.4, 0.8))
        y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
        crop = Image.fromarray(photo[y:y + s, x:x + s]).resize((cell, cell), Image.BICUBIC)
        r, q = divmod(int(c), 2)
        canvas[r * cell:(r + 1) * cell, q * cell:(q + 1) * cell] = np.asarray(crop, dtype=np.float64)
    buf = io.BytesIO()
    Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue(), labels


def build_multilabel(root: Path, cfg: MultiLabelSampleConfig, *, force: bool = False) -> Path:
    """Build the set under ``root/multilabel`` (reused when built with the same config); return the folder."""
    out = Path(root) / "multilabel"
    manifest = out / "manifest.json"
    if not force and manifest.is_file():
        try:
            if json.loads(manifest.read_text())["config"] == asdict(cfg):
                return out
        except (ValueError, KeyError):
            pass
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    names = class_names()
    photos = [load_photo(p) for p in CLASS_PHOTOS]
    counts = {}
    for split_id, (split, n) in enumerate((("train", cfg.train), ("val", cfg.val))):
        (tmp / "images" / split).mkdir(parents=True)
        lines = []
        for i in range(n):
            jpeg, labels = _composite(np.random.default_rng([cfg.seed, split_id, i]), photos, cfg.side)
            rel = f"images/{split}/{i:05d}.jpg"
            (tmp / rel).write_bytes(jpeg)
            lines.append(" ".join([rel, *(names[j] for j in labels)]) + "\n")
        (tmp / f"{split}.txt").write_text("".join(lines))
        counts[split] = n
    (tmp / "classes.txt").write_text("".join(f"{c}\n" for c in names))
    (tmp / "manifest.json").write_text(json.dumps({"config": asdict(cfg), "classes": names, "counts": counts},
                                                  indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
