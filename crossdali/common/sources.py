"""Where classification samples come from: ImageFolder, file list, TFRecord or MXNet RecordIO.

A ``DataSource`` is resolved and validated *before* a pipeline is built, so that a wrong path,
an empty class folder or a GIF named ``.jpg`` fails in seconds with the file named, not hours
into training. File-based sources are enumerated here (not by ``fn.readers.file``) so that DALI
and the native loaders of every framework see the same files with the same labels.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "TFRECORD_IMAGE_KEY",
    "TFRECORD_LABEL_KEY",
    "DataSource",
    "DataError",
    "IMAGE_EXTENSIONS",
    "resolve_source",
    "scan_image_folder",
    "read_file_list",
    "check_image_headers",
    "sniff_image_bytes",
    "find_undecodable",
    "explain_decode_failure",
    "explain_files_failure",
]

log = logging.getLogger(__name__)

#: Extensions ``fn.readers.file`` and the decoders accept (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".pnm", ".ppm", ".pgm", ".pbm", ".jp2", ".webp")

# Leading bytes of formats DALI decodes, and of common ones it does not.
_DECODABLE_MAGIC = {
    b"\xff\xd8\xff": "JPEG",
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
    b"\x00\x00\x00\x0cjP  ": "JPEG 2000",
    b"\xffO\xffQ": "JPEG 2000",
}
_UNSUPPORTED_MAGIC = {b"GIF87a": "GIF", b"GIF89a": "GIF", b"%PDF": "PDF", b"<": "HTML/XML text"}

FORMATS = ("imagefolder", "filelist", "tfrecord", "recordio")

#: TFRecord features crossdali reads (and its sample set writes): ImageNet's TFRecord convention.
TFRECORD_IMAGE_KEY = "image/encoded"
TFRECORD_LABEL_KEY = "image/class/label"


class DataError(ValueError):
    """The dataset on disk is missing, empty or malformed. The message names the path and the fix."""


@dataclass(frozen=True)
class DataSource:
    """One split of a dataset, ready for a reader.

    ``files``/``labels`` are set for ``imagefolder`` and ``filelist``; ``paths``/``index_paths``
    for ``tfrecord`` and ``recordio``. ``classes`` is known for ImageFolders only.
    """

    format: str
    root: Path
    files: tuple[str, ...] = ()
    labels: tuple[int, ...] = ()
    paths: tuple[str, ...] = ()
    index_paths: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    num_samples: int = 0

    @property
    def num_classes(self) -> int:
        return len(self.classes) if self.classes else (max(self.labels) + 1 if self.labels else 0)


def _sniff(path: str) -> str | None:
    """The format named by the file's first bytes; ``None`` if DALI can decode it."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return sniff_image_bytes(head)


def sniff_image_bytes(head: bytes) -> str | None:
    """What the leading bytes of an encoded image are (e.g. ``"a GIF file"``); ``None`` if DALI
    decodes that format. 16 bytes are enough."""
    if not head:
        return "an empty file"
    for magic in _DECODABLE_MAGIC:
        if head.startswith(magic):
            return None
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return None
    if head[:1] == b"P" and head[1:2] in b"123456":
        return None  # PNM family
    for magic, name in _UNSUPPORTED_MAGIC.items():
        if head.startswith(magic):
            return f"a {name} file"
    return f"not an image DALI can decode (starts with {head[:8]!r})"


def check_image_headers(files: list[str] | tuple[str, ...], *, threads: int = 16) -> None:
    """Raise ``DataError`` for the first file whose content is not a format DALI decodes.

    Reads 16 bytes per file: cheap next to an epoch, and it catches GIFs or HTML error pages
    saved as ``.jpg``. A JPEG corrupt past its header is caught at decode time instead.
    """
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for path, problem in zip(files, pool.map(_sniff, files)):
            if problem is not None:
                raise DataError(
                    f"{path} is {problem}, not an image DALI can decode (JPEG, PNG, BMP, TIFF, "
                    "JPEG 2000, WebP, PNM). Convert it (e.g. `python -c \"from PIL import Image; "
                    f"Image.open('{path}').convert('RGB').save('{Path(path).with_suffix('.jpg')}')\"`) or remove it."
                )


def scan_image_folder(root: Path, *, validate: bool = True) -> DataSource:
    """Enumerate ``root/<class>/<image>`` like torchvision's ImageFolder (classes sorted)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist; pass --data pointing at a folder with train/ and val/")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"{root} has no class sub-folders; expected {root}/<class>/<image>.jpg (ImageFolder layout)")
    files: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        names = sorted(
            e.name
            for e in os.scandir(root / cls)
            if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not names:
            raise DataError(
                f"class folder {root / cls} has no images (extensions {', '.join(IMAGE_EXTENSIONS)}); "
                "remove it or add images: an empty class would shift the labels of the classes after it"
            )
        files.extend(str(root / cls / n) for n in names)
        labels.extend([label] * len(names))
    if validate:
        check_image_headers(files)
    return DataSource(
        format="imagefolder", root=root, files=tuple(files), labels=tuple(labels),
        classes=tuple(classes), num_samples=len(files),
    )


def read_file_list(list_path: Path, *, root: Path | None = None, validate: bool = True) -> DataSource:
    """Read a DALI-style file list: one ``<path> <integer label>`` per line, paths relative to
    ``root`` (default: the list's folder)."""
    list_path = Path(list_path)
    if not list_path.is_file():
        raise DataError(f"file list {list_path} does not exist")
    root = Path(root) if root is not None else list_path.parent
    files: list[str] = []
    labels: list[int] = []
    for lineno, line in enumerate(list_path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit() or int(parts[1]) < 0:
            raise DataError(f"{list_path}:{lineno}: expected '<path> <non-negative integer label>', got {line!r}")
        path = root / parts[0]
        if not path.is_file():
            raise DataError(f"{list_path}:{lineno}: {path} does not exist")
        files.append(str(path))
        labels.append(int(parts[1]))
    if not files:
        raise DataError(f"file list {list_path} lists no images")
    if validate:
        check_image_headers(files)
    return DataSource(format="filelist", root=root, files=tuple(files), labels=tuple(labels), num_samples=len(files))


def _count_index_lines(index: Path) -> int:
    with open(index, "rb") as f:
        return sum(1 for line in f if line.strip())


def _record_source(fmt: str, data: Path, records: list[Path]) -> DataSource:
    indexes = [r.with_suffix(".idx") for r in records]
    for rec, idx in zip(records, indexes):
        if rec.stat().st_size == 0:
            raise DataError(f"record file {rec} is empty; rebuild it")
        if not idx.is_file():
            tool = "tfrecord2idx (ships with DALI)" if fmt == "tfrecord" else "im2rec.py, or mxnet.recordio.MXIndexedRecordIO"
            raise DataError(f"{rec} has no index file {idx}; DALI needs one: create it with {tool}: "
                            + (f"`tfrecord2idx {rec} {idx}`" if fmt == "tfrecord" else "rewrite the .rec with its .idx"))
    n = sum(_count_index_lines(i) for i in indexes)
    if n == 0:
        raise DataError(f"index files {', '.join(map(str, indexes))} list no records")
    return DataSource(format=fmt, root=data, paths=tuple(map(str, records)),
                      index_paths=tuple(map(str, indexes)), num_samples=n)


def resolve_source(data: Path | str, split: str, *, format: str = "auto", validate: bool = True) -> DataSource:
    """Find ``split`` (``train`` or ``val``) of the dataset at ``data``.

    Layouts (``format="auto"`` tries them in this order):

    - ``imagefolder``: ``data/<split>/<class>/*.jpg``
    - ``tfrecord``: ``data/<split>*.tfrecord`` each with a ``.idx`` beside it
    - ``recordio``: ``data/<split>.rec`` with ``data/<split>.idx``
    - ``filelist``: ``data/<split>.txt`` (``<path> <label>`` lines, paths relative to ``data``)
    """
    data = Path(data)
    if format not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    if not data.exists():
        raise DataError(f"data path {data} does not exist; pass --data pointing at your dataset "
                        "(or omit --data to use the embedded sample set)")
    if not data.is_dir():
        raise DataError(f"data path {data} is not a folder; expected a folder holding {split}/ (ImageFolder), "
                        f"{split}.tfrecord, {split}.rec or {split}.txt")
    tfrecords = sorted(data.glob(f"{split}*.tfrecord"))
    candidates = {
        "imagefolder": (data / split).is_dir(),
        "tfrecord": bool(tfrecords),
        "recordio": (data / f"{split}.rec").is_file(),
        "filelist": (data / f"{split}.txt").is_file(),
    }
    chosen = format if format != "auto" else next((f for f, ok in candidates.items() if ok), None)
    if chosen is None or not candidates[chosen]:
        raise DataError(
            f"no {split} split found in {data}: looked for {data / split}/ (ImageFolder), "
            f"{data}/{split}*.tfrecord, {data / (split + '.rec')} and {data / (split + '.txt')}"
        )
    if chosen == "imagefolder":
        return scan_image_folder(data / split, validate=validate)
    if chosen == "filelist":
        return read_file_list(data / f"{split}.txt", root=data, validate=validate)
    if chosen == "tfrecord":
        return _record_source("tfrecord", data, tfrecords)
    return _record_source("recordio", data, [data / f"{split}.rec"])


def _decode_problem(path: str) -> str | None:
    from PIL import Image  # defer: only needed once a decode has already failed

    try:
        with Image.open(path) as img:
            img.load()
    except Exception as e:  # noqa: BLE001 - any decoder failure is the answer we look for
        return f"{type(e).__name__}: {e}"
    return None


def find_undecodable(files: tuple[str, ...] | list[str], *, threads: int = 16) -> tuple[str, str] | None:
    """First ``(path, reason)`` among ``files`` that PIL cannot decode, or ``None``.

    DALI's decoder error does not name the sample, so after a decode failure the wrappers call
    this to name it. It decodes every file (threaded): seconds for thousands of images.
    """
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for path, problem in zip(files, pool.map(_decode_problem, files)):
            if problem is not None:
                return path, problem
    return None


def explain_decode_failure(source: DataSource, error: Exception) -> Exception:
    """Turn DALI's anonymous decoder failure into a ``DataError`` naming the bad file."""
    where = ", ".join(source.paths or source.files[:1]) or str(source.root)
    return explain_files_failure(error, files=source.files, where=where)


def explain_files_failure(error: Exception, *, files: tuple[str, ...] | list[str], where: str) -> Exception:
    """``error`` as a ``DataError`` naming the first of ``files`` that cannot be decoded, if DALI's
    message is a decoder failure (``where`` names the data when no single file is to blame);
    any other error is returned unchanged."""
    message = str(error)
    if "decoder" not in message and "nvImageCodec" not in message:
        return error
    if files:
        log.warning("DALI failed to decode an image; checking %d files to find it...", len(files))
        found = find_undecodable(files)
        if found is not None:
            path, reason = found
            return DataError(f"{path} cannot be decoded ({reason}); re-encode or remove it. DALI said: "
                             + message.strip().splitlines()[-1])
    return DataError(f"an image in {where} cannot be decoded; DALI said: {message.strip()}")
