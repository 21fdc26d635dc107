"""COCO-format detection data: find a split's annotation file and images, and list every problem
the DALI COCO reader would fail on late and vaguely (or drop silently, or turn into wrong boxes)
before any pipeline is built."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from crossdali.common.data.check.cache import default_cache_dir
from crossdali.common.data.check.core import CheckSettings, Problem, check_image_files, problems_error, sample_id
from crossdali.common.data.check.exclude import load_exclusions
from crossdali.common.errors import DataError

__all__ = ["DetectionSource", "coco_problems", "resolve_detection_source"]

log = logging.getLogger(__name__)

# A box may stick out of its image by this many pixels (COCO's own annotations do, by rounding).
_BOX_TOLERANCE_PX = 1.0


@dataclass(frozen=True)
class DetectionSource:
    """One split of a COCO-format dataset, validated: every image file exists, every box fits."""

    root: Path
    split: str
    file_root: Path
    annotations_file: Path
    num_images: int  # images the reader yields (those with at least one non-crowd box when skip_empty)
    num_images_total: int
    categories: tuple[tuple[int, str], ...]  # (COCO id, name) in the file's order: label i+1 <-> categories[i]
    image_sizes: dict[int, tuple[int, int]] = field(repr=False)  # image id -> (width, height)
    skip_empty: bool = True

    @property
    def num_classes(self) -> int:
        """Foreground classes; the model needs ``num_classes + 1`` outputs (0 = background)."""
        return len(self.categories)

    @property
    def num_samples(self) -> int:
        """Images per epoch (the loader contract's name for ``num_images``)."""
        return self.num_images

    @property
    def label_to_category(self) -> dict[int, int]:
        return {i + 1: cid for i, (cid, _) in enumerate(self.categories)}


def _find_annotations(root: Path, split: str) -> tuple[Path, Path]:
    """COCO layouts: ``annotations/instances_{split}[2017].json`` beside ``{split}[2017]/``."""
    tried = []
    for suffix in ("", "2017", "2014"):
        ann = root / "annotations" / f"instances_{split}{suffix}.json"
        images = root / f"{split}{suffix}"
        tried.append(str(ann))
        if ann.is_file():
            return ann, images
    raise DataError(f"no COCO annotation file for split {split!r} under {root}: looked for {', '.join(tried)}. "
                    f"Point --data at a folder holding annotations/instances_{split}.json and {split}/, or build "
                    "the sample set: python -m crossdali.common.data.sample_data --kind detection")


def coco_problems(coco: object, ann_path: Path, images_dir: Path, *, root: Path | None = None,
                  image_infos: dict | None = None) -> list[Problem]:
    """Every problem of a COCO annotation file, not just the first: ``Problem`` rows whose
    ``sample`` is the image file (relative to ``root``) or the annotation file for file-level ones.

    Errors: malformed JSON structure, duplicate image ids, an image id without a file, an
    annotation for an unknown image or category, a bbox that is not 4 numbers or lies outside its
    image, non-positive width/height, and (with ``image_infos``: path -> header from the check's
    fast pass) a width/height that disagrees with the image (DALI makes boxes relative with the
    JSON's numbers: wrong boxes, silently). Warnings: images without annotations (left out of
    training by ``skip_empty``), boxes under 0.1 px (dropped by the reader).
    """
    ann_id = sample_id(ann_path, root)
    problems: list[Problem] = []

    def whole(text: str, fix: str) -> None:
        problems.append(Problem(ann_id, str(ann_path), "bad-annotations", f"{ann_path}: {text}; {fix}"))

    def bad(code: str, file: str | None, what: str, entry: object, fix: str, severity: str = "error") -> None:
        sid = sample_id(images_dir / file, root) if file else ann_id
        problems.append(Problem(sid, str(images_dir / file) if file else str(ann_path), code,
                                f"{ann_path}: {what} in {json.dumps(entry)[:200]}; {fix}", severity=severity))

    if not isinstance(coco, dict) or not all(isinstance(coco.get(k), list) for k in ("images", "annotations", "categories")):
        whole("is not COCO format: it needs lists 'images', 'annotations' and 'categories' at the top level",
              "re-export it in COCO format")
        return problems
    categories = set()
    for c in coco["categories"]:
        if not isinstance(c, dict) or not isinstance(c.get("id"), int):
            bad("bad-annotations", None, "category without an integer 'id'", c, "give every category an integer id")
            continue
        categories.add(c["id"])
    if not categories:
        whole("lists no categories", "a detector needs at least one")
    sizes: dict[object, tuple[float, float]] = {}
    names: dict[object, str] = {}
    for im in coco["images"]:
        if not isinstance(im, dict) or not all(k in im for k in ("id", "file_name", "width", "height")):
            bad("bad-annotations", None, "image entry without id/file_name/width/height", im, "add the missing keys")
            continue
        name = str(im["file_name"])
        if im["id"] in sizes:
            bad("duplicate-id", name, f"duplicate image id {im['id']} (also {names[im['id']]})", im,
                "image ids must be unique: renumber one (and its annotations) or remove it")
            continue
        if not (images_dir / name).is_file():
            bad("missing-file", name, f"image id {im['id']} has no file {images_dir / name}", im,
                "add the file or remove the image and its annotations from the JSON")
        width, height = im["width"], im["height"]
        if not (isinstance(width, int | float) and isinstance(height, int | float)) or width <= 0 or height <= 0:
            bad("size-mismatch", name, f"image id {im['id']} has width/height {width}x{height}", im,
                "write the image's real size in pixels")
            width = height = 0
        info = (image_infos or {}).get(str(images_dir / name))
        if info is not None and info.format and width and (info.width, info.height) != (int(width), int(height)):
            bad("size-mismatch", name, f"image id {im['id']} is {int(width)}x{int(height)} in the annotation file but "
                f"{images_dir / name} is {info.width}x{info.height}: DALI makes the boxes relative with the JSON's size, "
                f"so its boxes would be scaled by {info.width / width:.3g} x {info.height / height:.3g}", im,
                "write the image's real width/height into the JSON")
        sizes[im["id"]] = (width, height)
        names[im["id"]] = name
    with_boxes: set = set()
    annotated: set = set()
    tol = _BOX_TOLERANCE_PX
    for a in coco["annotations"]:
        if not isinstance(a, dict) or "image_id" not in a or "bbox" not in a or "category_id" not in a:
            bad("bad-annotations", None, "annotation without image_id/category_id/bbox", a, "add the missing keys")
            continue
        if a["image_id"] not in sizes:
            bad("bad-annotations", None, f"annotation for image id {a['image_id']}, which is not in 'images'", a,
                "add the image entry or remove the annotation")
            continue
        name = names[a["image_id"]]
        annotated.add(a["image_id"])
        if a["category_id"] not in categories:
            bad("bad-annotations", name, f"annotation with category id {a['category_id']}, which is not in 'categories'",
                a, "add the category or fix the id")
            continue
        box = a["bbox"]
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, int | float) for v in box)):
            bad("box-outside", name, "bbox is not [x, y, width, height]", a, "write boxes as four numbers in pixels")
            continue
        x, y, w, h = box
        width, height = sizes[a["image_id"]]
        if width and (w < 0 or h < 0 or x < -tol or y < -tol or x + w > width + tol or y + h > height + tol):
            bad("box-outside", name, f"box {box} lies outside its image {name} ({width}x{height})", a,
                "clip the box to the image or fix the image's width/height")
            continue
        if w < 0.1 or h < 0.1:
            bad("empty-box", name, f"box {box} is empty (under 0.1 px): the reader drops it", a,
                "remove the annotation or give it a real size", severity="warning")
            continue
        if not a.get("iscrowd", 0):
            with_boxes.add(a["image_id"])
    for image_id, name in names.items():
        if image_id not in annotated:
            bad("no-annotations", name, f"image id {image_id} has no annotations: left out of training (skip_empty), "
                "kept in validation as an image without objects", {"id": image_id, "file_name": name},
                "annotate it if it has objects", severity="warning")
    return problems


def _filtered_annotations(ann_path: Path, images_dir: Path, coco: dict, exclusions) -> tuple[Path, dict, int]:
    """A copy of the annotation file without the excluded images and their annotations, in the
    check cache (``fn.readers.coco`` and every other reader then never see them)."""
    dropped = {im.get("id") for im in coco["images"] if isinstance(im, dict)
               and exclusions.excludes_file(images_dir / str(im.get("file_name", "")))}
    if not dropped:
        return ann_path, coco, 0
    kept = dict(coco, images=[im for im in coco["images"] if not (isinstance(im, dict) and im.get("id") in dropped)],
                annotations=[a for a in coco["annotations"] if not (isinstance(a, dict) and a.get("image_id") in dropped)])
    digest = hashlib.sha1(f"{ann_path.resolve()}:{ann_path.stat().st_mtime_ns}:{sorted(map(str, dropped))}".encode())
    out = default_cache_dir() / "exclude" / digest.hexdigest()[:16] / ann_path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(kept), encoding="utf-8")
    return out, kept, len(dropped)


def resolve_detection_source(data: str | Path, split: str, *, annotations_file: str | Path | None = None,
                             file_root: str | Path | None = None, skip_empty: bool | None = None,
                             validate: bool = True, exclude=None, max_pixels: int | None = None) -> DetectionSource:
    """Find and validate one split of a COCO-format dataset up front.

    DALI's COCO reader fails late and vaguely on a bad entry (or silently drops it, or makes
    boxes relative with a wrong size); this reads the JSON once and raises one ``DataError``
    listing every bad entry and the fix (see ``coco_problems``). ``validate`` also runs the fast
    pass of ``crossdali check`` over the image files (headers against the JSON's sizes, formats,
    truncation, size limit; cached by path, size and mtime). ``exclude`` (an exclusion list or
    image paths) leaves images out through a filtered copy of the annotation file.
    ``skip_empty`` defaults to True for train (SSD cannot learn from an image without boxes) and
    False for val.
    """
    root = Path(data)
    if annotations_file is None:
        if not root.is_dir():
            raise DataError(f"--data {root} is not a folder; pass a COCO-format dataset folder")
        ann_path, images_dir = _find_annotations(root, split)
    else:
        ann_path, images_dir = Path(annotations_file), root / split
        if not ann_path.is_file():
            raise DataError(f"annotation file {ann_path} does not exist; check the path")
    images_dir = Path(file_root) if file_root is not None else images_dir
    if not images_dir.is_dir():
        raise DataError(f"image folder {images_dir} for {ann_path} does not exist; pass file_root=")
    skip_empty = split == "train" if skip_empty is None else skip_empty
    try:
        coco = json.loads(ann_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"annotation file {ann_path} is not valid JSON ({e}); re-export it in COCO format") from e
    if not isinstance(coco, dict) or not all(isinstance(coco.get(k), list) for k in ("images", "annotations", "categories")):
        raise DataError(f"annotation file {ann_path} is not COCO format: it needs lists 'images', 'annotations' "
                        "and 'categories' at the top level")
    exclusions = load_exclusions(exclude)
    original = ann_path
    if exclusions:
        ann_path, coco, dropped = _filtered_annotations(ann_path, images_dir, coco, exclusions)
        log.warning("%s: excluded %d of %d images listed in %s", original, dropped,
                    dropped + len(coco["images"]), exclusions.origin or "exclude=")
    infos = None
    files = sorted({str(images_dir / str(im["file_name"])) for im in coco["images"]
                    if isinstance(im, dict) and "file_name" in im and (images_dir / str(im["file_name"])).is_file()})
    image_problems = []
    if validate and files:
        settings = CheckSettings(threads=8, **({"max_pixels": max_pixels} if max_pixels else {}))
        image_problems, infos = check_image_files(files, root=images_dir.parent, settings=settings)
    problems = coco_problems(coco, ann_path, images_dir, root=images_dir.parent, image_infos=infos) + image_problems
    if not validate:  # only what stops the source from being built at all (the check reports the rest)
        problems = [p for p in problems if p.code in ("bad-annotations", "duplicate-id")]
    error = problems_error(problems, where=str(original), total=len(coco["images"]), data_hint=str(root))
    if error is not None:
        raise error
    categories = {c["id"]: str(c.get("name", c["id"])) for c in coco["categories"]}
    sizes = {im["id"]: (int(im["width"]), int(im["height"])) for im in coco["images"]}
    with_boxes = {a["image_id"] for a in coco["annotations"] if not a.get("iscrowd", 0)
                  and a["bbox"][2] >= 0.1 and a["bbox"][3] >= 0.1}
    num = len(with_boxes) if skip_empty else len(sizes)
    if num == 0:
        raise DataError(f"{ann_path} has no image with a (non-crowd) box; nothing to train on")
    return DetectionSource(root=root, split=split, file_root=images_dir, annotations_file=ann_path, num_images=num,
                           num_images_total=len(sizes), categories=tuple(categories.items()),
                           image_sizes=sizes, skip_empty=skip_empty)
