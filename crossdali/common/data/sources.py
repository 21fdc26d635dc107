"""Where classification samples come from: ImageFolder, file list, TFRecord, MXNet RecordIO or WebDataset shards.

A ``DataSource`` is resolved and validated *before* a pipeline is built, so that a wrong path,
an empty class folder or a GIF named ``.jpg`` fails in seconds with the file named, not hours
into training. File-based sources are enumerated here (not by ``fn.readers.file``) so that DALI
and the native loaders of every framework see the same files with the same labels.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shlex
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crossdali.common.data.check import records as rec_io
from crossdali.common.data.check.cache import default_cache_dir
from crossdali.common.data.check.core import (
    CheckSettings,
    check_image_files,
    check_record_files,
    problems_error,
    progress_log,
    resolve_device,
)
from crossdali.common.data.check.decode import describe_dali_error
from crossdali.common.data.check.exclude import Exclusions, apply_exclusions, load_exclusions
from crossdali.common.data.formats import FORMATS, IMAGE_EXTENSIONS, DataSource
from crossdali.common.data.object_store import is_object_url, resolve_object_source
from crossdali.common.errors import DataError

__all__ = [
    "DataSource",
    "resolve_source",
    "scan_image_folder",
    "read_file_list",
    "check_image_headers",
    "sniff_image_bytes",
    "find_undecodable",
    "explain_decode_failure",
    "explain_files_failure",
    "validate_files",
]

log = logging.getLogger(__name__)

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
    """Raise ``DataError`` naming the files whose content DALI cannot decode: ``validate_files``
    with no dataset root, for a plain list of files."""
    validate_files(files, root=None, where="the given files")


def validate_files(files: list[str] | tuple[str, ...], *, root: Path | str | None, where: str,
                   max_pixels: int | None = None, data_hint: str | None = None) -> None:
    """The fast pass of ``crossdali check`` over image files (cached by path, size and mtime):
    raise one ``DataError`` listing every file that is unreadable, empty, not an image DALI
    decodes, misnamed, truncated, structurally corrupt, or whose header claims more than
    ``max_pixels`` (a forged header is refused before any pixel is allocated)."""
    settings = CheckSettings(threads=8, progress=progress_log(len(files), where),
                             **({"max_pixels": max_pixels} if max_pixels else {}))
    problems, _ = check_image_files(list(files), root=root, settings=settings)
    error = problems_error(problems, where=where, total=len(files), data_hint=data_hint)
    if error is not None:
        raise error


def _class_folders(root: Path) -> list[str]:
    """The class folders of ``root``, sorted; an entry that cannot be followed (a symbolic link loop)
    is one ``DataError`` naming it: whether it was meant as a class decides every label after it."""
    classes = []
    for e in os.scandir(root):
        if e.name.startswith("."):
            continue
        try:
            if e.is_dir():
                classes.append(e.name)
        except OSError as err:
            raise DataError(f"{e.path} cannot be followed ({err.strerror or err}); make it a class folder or remove it "
                            f"from {root}") from None
    return sorted(classes)


def _class_images(folder: Path) -> list[str]:
    """The image names of one class folder, sorted. An image name that cannot be read as a file (a
    symbolic link loop, a link to nothing) is kept: the check then names it as a bad sample, where
    skipping it would hide it; an unreadable folder is one ``DataError``."""
    try:
        entries = list(os.scandir(folder))
    except OSError as e:
        raise DataError(f"class folder {folder} cannot be read ({e.strerror or e}); check its permissions, or remove "
                        "it") from None
    names = []
    for e in entries:
        if not e.name.lower().endswith(IMAGE_EXTENSIONS):
            continue
        try:
            keep = e.is_file() or (e.is_symlink() and not e.is_dir())
        except OSError:  # ELOOP, EACCES: stat fails, the fast pass reports why
            keep = True
        if keep:
            names.append(e.name)
    return sorted(names)


def scan_image_folder(root: Path, *, validate: bool = True, exclude: Exclusions | None = None,
                      max_pixels: int | None = None) -> DataSource:
    """Enumerate ``root/<class>/<image>`` like torchvision's ImageFolder (classes sorted); leave
    out the ``exclude``d samples (labels unchanged), then run the fast check (``validate``)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist; pass --data pointing at a folder with train/ and val/")
    classes = _class_folders(root)
    if not classes:
        raise DataError(f"{root} has no class sub-folders; expected {root}/<class>/<image>.jpg (ImageFolder layout)")
    files: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        names = _class_images(root / cls)
        if not names:
            raise DataError(
                f"class folder {root / cls} has no images (extensions {', '.join(IMAGE_EXTENSIONS)}); "
                "remove it or add images: an empty class would shift the labels of the classes after it"
            )
        files.extend(str(root / cls / n) for n in names)
        labels.extend([label] * len(names))
    files, labels = apply_exclusions(files, labels, exclude or Exclusions(), str(root))
    if validate:
        # the hint names the dataset folder and the split: `crossdali check` finds no dataset in a split folder
        validate_files(files, root=root.parent, where=str(root), max_pixels=max_pixels,
                       data_hint=f"{shlex.quote(str(root.parent))} --split {shlex.quote(root.name)}")
    return DataSource(
        format="imagefolder", root=root, files=tuple(files), labels=tuple(labels),
        classes=tuple(classes), num_samples=len(files),
    )


def read_file_list(list_path: Path, *, root: Path | None = None, validate: bool = True,
                   exclude: Exclusions | None = None, max_pixels: int | None = None,
                   require_files: bool = True) -> DataSource:
    """Read a DALI-style file list: one ``<path> <integer label>`` per line, paths relative to
    ``root`` (default: the list's folder).

    Args:
        validate: run the cached fast check over the listed images.
        require_files: refuse a listed file that does not exist (after the exclusions); ``crossdali
            check`` turns it off to report such a file as a bad sample of its own.
    """
    list_path = Path(list_path)
    if not list_path.is_file():
        raise DataError(f"file list {list_path} does not exist")
    root = Path(root) if root is not None else list_path.parent
    files: list[str] = []
    labels: list[int] = []
    lines: dict[str, int] = {}
    for lineno, line in enumerate(list_path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit() or int(parts[1]) < 0:
            raise DataError(f"{list_path}:{lineno}: expected '<path> <non-negative integer label>', got {line!r}")
        files.append(str(root / parts[0]))
        labels.append(int(parts[1]))
        lines.setdefault(files[-1], lineno)
    if not files:
        raise DataError(f"file list {list_path} lists no images")
    # exclusions first, so that a listed file that is gone can be excluded
    files, labels = apply_exclusions(files, labels, exclude or Exclusions(), str(list_path))
    missing = [f for f in files if not os.path.isfile(f)] if require_files else []
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{list_path}:{lines[missing[0]]}: {missing[0]} does not exist{more}; restore it, remove its line, "
                        f"or leave it out: `crossdali check {shlex.quote(str(list_path))}` writes an exclusion list to "
                        "pass as --exclude FILE")
    if validate:
        validate_files(files, root=root, where=str(list_path), max_pixels=max_pixels)
    return DataSource(format="filelist", root=root, files=tuple(files), labels=tuple(labels), num_samples=len(files))


def _count_index_lines(index: Path) -> int:
    with open(index, "rb") as f:
        return sum(1 for line in f if line.strip())


def _record_source(fmt: str, data: Path, records: list[Path], *, validate: bool = True,
                   exclude: Exclusions | None = None, max_pixels: int | None = None) -> DataSource:
    """Records with their indexes; ``validate`` runs the fast check (index against records, every
    record's image header; cached), ``exclude`` leaves records out through a filtered copy of
    the index in the check cache (DALI never reads a record its index does not list)."""
    exclude = exclude or Exclusions()
    indexes = [r.with_suffix(".idx") for r in records]
    for rec, idx in zip(records, indexes):
        if rec.stat().st_size == 0:
            raise DataError(f"record file {rec} is empty; rebuild it")
        if not idx.is_file():
            how = {"tfrecord": f"tfrecord2idx (ships with DALI): `tfrecord2idx {rec} {idx}`",
                   "webdataset": f"wds2idx (ships with DALI): `wds2idx {rec} {idx}`",
                   "recordio": "im2rec.py, or mxnet.recordio.MXIndexedRecordIO: rewrite the .rec with its .idx"}[fmt]
            raise DataError(f"{rec} has no index file {idx}; DALI needs one: create it with {how}")
    kept = [(r, i) for r, i in zip(records, indexes) if not exclude.excludes_file(r)]
    if validate:
        settings = CheckSettings(**({"max_pixels": max_pixels} if max_pixels else {}))
        problems, total = check_record_files(fmt, [str(r) for r, _ in kept], [str(i) for _, i in kept], root=data,
                                             settings=settings)
        left = [p for p in problems if "#" not in p.sample
                or int(p.sample.rsplit("#", 1)[1]) not in exclude.excluded_records(p.path)]
        error = problems_error(left, where=f"{fmt} records of {data}", total=total, data_hint=shlex.quote(str(data)))
        if error is not None:
            raise error
    paths, index_paths, n, dropped = [], [], 0, 0
    for rec, idx in kept:
        entries = rec_io.read_index(fmt, idx) if exclude else None
        skip = exclude.excluded_records(rec) if exclude else set()
        if skip:
            keep = [e for e in entries if e.position not in skip]
            dropped += len(entries) - len(keep)
            if not keep:
                continue
            digest = hashlib.sha1(f"{idx.resolve()}:{idx.stat().st_mtime_ns}:{sorted(skip)}".encode()).hexdigest()[:16]
            filtered = default_cache_dir() / "exclude" / f"{idx.stem}-{digest}.idx"
            filtered.parent.mkdir(parents=True, exist_ok=True)
            rec_io.write_index(keep, filtered, fmt=fmt)
            idx, count = filtered, len(keep)
        else:
            count = len(rec_io.read_index(fmt, idx)) if fmt == "webdataset" else _count_index_lines(idx)
        paths.append(str(rec))
        index_paths.append(str(idx))
        n += count
    if exclude:
        whole = len(records) - len(kept)
        log.warning("%s records of %s: excluded %d records%s listed in %s", fmt, data, dropped,
                    f" and {whole} whole record files" if whole else "", exclude.origin or "exclude=")
    if n == 0 and len(kept) < len(records):
        whole = [r for r in records if exclude.excludes_file(r)]
        raise DataError(f"the exclusion list {exclude.origin or ''} leaves out every record of {data}, "
                        f"{len(whole)} record file{'s' if len(whole) > 1 else ''} whole ({', '.join(map(str, whole[:3]))}"
                        f"{', ...' if len(whole) > 3 else ''}): nothing to train on. A record file is left out whole when "
                        f"its index does not match it, so no record of it can be found; "
                        f"{rec_io.rebuild_hint(fmt, whole[0], whole[0].with_suffix('.idx'))}, then run `crossdali check "
                        f"{shlex.quote(str(data))}` again")
    if n == 0:
        raise DataError(f"index files {', '.join(map(str, indexes))} list no records"
                        + (" (after the exclusions)" if exclude else ""))
    return DataSource(format=fmt, root=data, paths=tuple(paths), index_paths=tuple(index_paths), num_samples=n)


def resolve_source(data: Path | str, split: str, *, format: str = "auto", validate: bool = True,
                   exclude: str | os.PathLike | Iterable[str] | Exclusions | None = None,
                   max_pixels: int | None = None) -> DataSource:
    """Find ``split`` (``train`` or ``val``) of the dataset at ``data``.

    ``validate`` runs the fast pass of ``crossdali check`` (headers, structure, indexes; cached
    by path, size and mtime) and raises one ``DataError`` listing every bad sample. ``exclude``
    (the exclusion list ``crossdali check`` writes, or sample ids) leaves samples out first;
    ``max_pixels`` is the largest image a header may claim (default: Pillow's bomb limit).

    Layouts (``format="auto"`` tries them in this order):

    - ``imagefolder``: ``data/<split>/<class>/*.jpg``
    - ``tfrecord``: ``data/<split>*.tfrecord`` each with a ``.idx`` beside it
    - ``recordio``: ``data/<split>.rec`` with ``data/<split>.idx``
    - ``webdataset``: ``data/<split>-*.tar`` shards (``.jpg`` + ``.cls`` per sample), each with
      the ``.idx`` of DALI's ``wds2idx`` beside it
    - ``filelist``: ``data/<split>.txt`` (``<path> <label>`` lines, paths relative to ``data``)

    ``data`` may be an ``s3://bucket/prefix`` URL (a string) holding the same layouts: DALI then
    reads the objects from the store (``crossdali.common.data.object_store``, docs/object-stores.md).
    """
    if str(data).startswith("s3:/") and not os.path.exists(data):
        url = str(data) if is_object_url(str(data)) else "s3://" + str(data)[len("s3:/"):]  # a Path folds the //
        return resolve_object_source(url, split, format=format, validate=validate, exclude=exclude,
                                     max_pixels=max_pixels)
    data = Path(data)
    if format not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    if not data.exists():
        raise DataError(f"data path {data} does not exist; pass --data pointing at your dataset "
                        "(or omit --data to use the embedded sample set)")
    if not data.is_dir():
        raise DataError(f"data path {data} is not a folder; expected a folder holding {split}/ (ImageFolder), "
                        f"{split}.tfrecord, {split}.rec, {split}-*.tar (WebDataset) or {split}.txt")
    tfrecords = sorted(data.glob(f"{split}*.tfrecord"))
    shards = sorted(data.glob(f"{split}-*.tar"))
    candidates = {
        "imagefolder": (data / split).is_dir(),
        "tfrecord": bool(tfrecords),
        "recordio": (data / f"{split}.rec").is_file(),
        "webdataset": bool(shards),
        "filelist": (data / f"{split}.txt").is_file(),
    }
    chosen = format if format != "auto" else next((f for f, ok in candidates.items() if ok), None)
    if chosen is None or not candidates[chosen]:
        raise DataError(
            f"no {split} split found in {data}: looked for {data / split}/ (ImageFolder), "
            f"{data}/{split}*.tfrecord, {data / (split + '.rec')}, {data}/{split}-*.tar (WebDataset) and "
            f"{data / (split + '.txt')}"
        )
    checks = dict(validate=validate, exclude=load_exclusions(exclude), max_pixels=max_pixels)
    if chosen == "imagefolder":
        return scan_image_folder(data / split, **checks)
    if chosen == "filelist":
        return read_file_list(data / f"{split}.txt", root=data, **checks)
    if chosen == "tfrecord":
        return _record_source("tfrecord", data, tfrecords, **checks)
    if chosen == "webdataset":
        return _record_source("webdataset", data, shards, **checks)
    return _record_source("recordio", data, [data / f"{split}.rec"], **checks)


def _decode_problem(path: str) -> str | None:
    from PIL import Image  # defer: only needed once a decode has already failed

    try:
        with Image.open(path) as img:
            img.load()
    except Exception as e:  # noqa: BLE001 - any decoder failure is the answer we look for
        return f"{type(e).__name__}: {e}"
    return None


def find_undecodable(files: tuple[str, ...] | list[str], *, threads: int = 16) -> tuple[str, str] | None:
    """First ``(path, reason)`` among ``files`` that PIL cannot decode, or ``None`` (the native
    loaders' view; the DALI loaders use ``explain_files_failure``, which asks DALI itself)."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for path, problem in zip(files, pool.map(_decode_problem, files)):
            if problem is not None:
                return path, problem
    return None


# What DALI 2.4 writes about the failing sample (measured): a reader names the file ("File mapping
# failed: <path>", "Error while parsing TFRecord file: <path> at index <byte offset>"); a decoder
# names nothing ("nvImageCodec failure: '#4'"), and then the files are checked to find it.
_DALI_NAMES_FILE = re.compile(r"(?:File mapping failed: |TFRecord file: |[Ff]ailed to open (?:file )?)(?P<path>\S+?)"
                              r"(?: at index (?P<offset>\d+))?(?: \(|\s|$)")


def _is_data_failure(message: str) -> bool:
    return any(k in message for k in ("decoder", "nvImageCodec", "File mapping failed", "TFRecord file",
                                      "recordio", "RecordIO", "Incomplete or corrupted record", "Failed to open"))


def explain_decode_failure(source: DataSource, error: Exception) -> Exception:
    """Turn DALI's failure on ``source`` into a ``DataError`` naming the bad file or record and
    the fix, identically for every framework (any other error is returned unchanged)."""
    if source.paths:
        return explain_records_failure(source, error)
    # the split's folder: DALI's message does not say which file, so naming one here would name a wrong one
    return explain_files_failure(error, files=source.files, where=str(source.root))


def _first_bad(problems) -> object | None:
    errors = [p for p in problems if p.severity == "error"]
    return errors[0] if errors else None


def explain_files_failure(error: Exception, *, files: tuple[str, ...] | list[str], where: str) -> Exception:
    """``error`` as a ``DataError`` naming the file DALI failed on: the file its message names,
    else the first of ``files`` that the check finds bad (fast pass, then DALI's own decoder);
    an error that is not about the data is returned unchanged."""
    message = str(error)
    if not _is_data_failure(message):
        return error
    said = describe_dali_error(error)
    m = _DALI_NAMES_FILE.search(message)
    if m:
        return DataError(f"{m['path']} cannot be read by DALI ({said}); re-encode, re-download or remove it, "
                         f"or leave it out with --exclude (run `crossdali check` on the data)")
    if files:
        log.warning("DALI failed on a sample in %s without naming it; checking %s to find it...", where,
                    "the file" if len(files) == 1 else f"its {len(files)} files")
        for depth in ("fast", "full"):
            settings = CheckSettings(depth=depth, device=resolve_device("auto"), threads=8)
            bad = _first_bad(check_image_files(list(files), root=None, settings=settings)[0])
            if bad is not None:
                return DataError(f"{bad.message}. DALI said: {said}")
    return DataError(f"a sample in {where} cannot be decoded, and checking the files found no culprit; "
                     f"DALI said: {said}. Run `crossdali check` on the data with --depth full")


def explain_records_failure(source: DataSource, error: Exception) -> Exception:
    """DALI's failure on TFRecord/RecordIO data as a ``DataError`` naming the record file, the
    record and the fix (checks the indexes and records; a reader's own message names the file
    and byte offset, which the index turns into the record number)."""
    message = str(error)
    if not _is_data_failure(message):
        return error
    said = describe_dali_error(error)
    log.warning("DALI failed on a record in %s; checking %d record files to find it...", source.root, len(source.paths))
    for depth in ("fast", "full"):
        settings = CheckSettings(depth=depth, device=resolve_device("auto"))
        bad = _first_bad(check_record_files(source.format, source.paths, source.index_paths, root=source.root,
                                            settings=settings)[0])
        if bad is not None:
            return DataError(f"{bad.message}. DALI said: {said}")
    return DataError(f"a record in {', '.join(source.paths)} cannot be read, and checking the records found no "
                     f"culprit; DALI said: {said}. Run `crossdali check {source.root} --depth full`")
