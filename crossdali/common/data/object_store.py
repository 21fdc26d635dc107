"""Datasets in an S3-compatible object store: ``--data s3://bucket/prefix``.

The layouts are those of a local folder (``crossdali.common.data.sources.resolve_source``):
ImageFolder, file lists, TFRecord, RecordIO and WebDataset shards under the prefix. DALI's readers
read the images and records straight from the store (DALI is built with the AWS SDK and opens
``s3://`` paths in ``files``, ``path`` and ``paths``), so nothing is copied to local disk first.
What DALI cannot do is list a prefix for the loaders of every framework the same way, so the class
folders of an ImageFolder and the shards of a record set are listed here with boto3; the index
files of record sets (a few bytes a record) are downloaded once into the local cache, keyed by the
object's ETag, because counting the samples, leaving samples out and checking the records need
them before DALI starts.

Credentials and the server come from the usual AWS variables, read by boto3 and by DALI's AWS SDK
alike: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (or ``AWS_PROFILE``), ``AWS_REGION``, and
``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` for a server other than AWS (MinIO, Ceph, moto).
Nothing here logs or stores them: messages name the URL and the variables, never their values.

docs/object-stores.md says what is read where and what it costs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
import posixpath
import shlex
import tarfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from crossdali.common.data.check import records as rec_io
from crossdali.common.data.check.cache import default_cache_dir
from crossdali.common.data.check.core import (
    CheckSettings,
    Problem,
    _problem,
    _size_problem,
    problems_error,
    progress_log,
)
from crossdali.common.data.check.exclude import Exclusions, apply_exclusions, load_exclusions
from crossdali.common.data.check.images import inspect_image
from crossdali.common.data.formats import FORMATS, IMAGE_EXTENSIONS, DataSource
from crossdali.common.errors import DataError

__all__ = ["SCHEMES", "is_object_url", "data_location", "ObjectLocation", "s3_client", "resolve_object_source",
           "find_object_splits", "check_object_source", "check_tls_beside_tensorflow"]

log = logging.getLogger(__name__)

#: URL schemes read from an object store (DALI's readers also open ``gs://``, which is not wired here).
SCHEMES = ("s3://",)

_CREDENTIALS_FIX = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for a "
                    "server other than AWS (docs/object-stores.md)")


def is_object_url(data) -> bool:
    """Whether ``data`` (a ``--data`` value) names an object store rather than a local path."""
    return isinstance(data, str) and data.startswith(SCHEMES)


def data_location(text: str) -> Path | str:
    """An argparse ``type`` for ``--data``: an ``s3://`` URL stays a string (``Path`` would fold its
    ``//``), anything else is a ``Path``."""
    return text if is_object_url(text) else Path(text)


@dataclass(frozen=True)
class ObjectLocation:
    """``s3://bucket/prefix`` split into its parts; ``prefix`` has no leading or trailing slash."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> ObjectLocation:
        rest = url[len("s3://"):] if url.startswith("s3://") else ""
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise DataError(f"{url!r} names no bucket; write --data s3://BUCKET/PREFIX")
        return cls(bucket, posixpath.normpath(prefix).strip("/") if prefix.strip("/") else "")

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"

    def __str__(self) -> str:
        return self.url(self.prefix)


def s3_client():
    """A boto3 S3 client configured by the AWS variables (region: ``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``; endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise DataError("reading s3:// data needs boto3 (pip install -r requirements/base.txt)") from None
    for name in ("boto3", "botocore", "s3transfer", "urllib3"):  # their INFO lines say where credentials came from
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    return boto3.session.Session().client("s3", region_name=region,
                                          config=Config(retries={"max_attempts": 3, "mode": "standard"},
                                                        max_pool_connections=32))


def check_tls_beside_tensorflow(url: str) -> None:
    """Refuse, with the fix, to hand ``s3://`` data to DALI in a process where TensorFlow was imported
    before the system's libcrypto: TensorFlow's own TLS symbols then shadow it, and the first S3
    reader DALI builds aborts the whole process (its AWS SDK's ``s2n_init() failed``: a libcrypto
    of another major version). Preloading the system libcrypto (``LD_PRELOAD``) puts it first."""
    import sys

    if "tensorflow" not in sys.modules or "libcrypto" in os.environ.get("LD_PRELOAD", ""):
        return
    import ctypes.util

    lib = ctypes.util.find_library("crypto") or "libcrypto.so.3"
    raise DataError(f"{url}: DALI reads s3:// data through an AWS SDK that cannot start after TensorFlow is imported "
                    f"(its TLS library would find TensorFlow's libcrypto and abort the process); start the process with "
                    f"LD_PRELOAD={lib} (docs/object-stores.md#tensorflow)")


def _endpoint(client) -> str:
    return getattr(getattr(client, "meta", None), "endpoint_url", None) or "AWS"


def _s3_error(error: Exception, url: str, client=None) -> DataError:
    """botocore's failure on ``url`` as one line naming the URL and the fix (never a credential)."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, PartialCredentialsError

    where = _endpoint(client)
    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return DataError(f"{url}: no AWS credentials found; {_CREDENTIALS_FIX}")
    if isinstance(error, EndpointConnectionError):
        return DataError(f"{url}: cannot reach the S3 endpoint {where}; check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) "
                         "and that the server is up")
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        bucket = ObjectLocation.parse(url).bucket if url.startswith("s3://") else url
        if code == "NoSuchBucket":
            return DataError(f"{url}: bucket {bucket!r} does not exist at {where}; check the bucket name in --data, or "
                             "AWS_ENDPOINT_URL if the bucket is on another server")
        if code in ("NoSuchKey", "404"):
            return DataError(f"{url} does not exist; check the prefix in --data")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                    "InvalidToken"):
            return DataError(f"{url}: the S3 server at {where} refused the credentials ({code}); check "
                             f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and that they may list and read {bucket}")
        return DataError(f"{url}: S3 error {code or type(error).__name__} from {where}; see docs/object-stores.md")
    return DataError(f"{url}: {type(error).__name__} while talking to {where}; see docs/object-stores.md")


def _botocore_errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


@dataclass(frozen=True)
class _Object:
    key: str
    size: int
    etag: str


def _list(client, loc: ObjectLocation, prefix: str, *, delimiter: str | None = None) -> tuple[list[_Object], list[str]]:
    """Objects under ``prefix`` (and the sub-"folders" when ``delimiter`` is given), in key order."""
    objects, folders = [], []
    kwargs = {"Bucket": loc.bucket, "Prefix": prefix, **({"Delimiter": delimiter} if delimiter else {})}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
            objects += [_Object(o["Key"], int(o["Size"]), str(o.get("ETag", "")).strip('"'))
                        for o in page.get("Contents", ())]
            folders += [p["Prefix"] for p in page.get("CommonPrefixes", ())]
    except _botocore_errors() as e:
        raise _s3_error(e, loc.url(prefix), client) from None
    return objects, folders


def _get(client, loc: ObjectLocation, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
    kwargs = {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"} if byte_range else {}
    try:
        return client.get_object(Bucket=loc.bucket, Key=key, **kwargs)["Body"].read()
    except _botocore_errors() as e:
        raise _s3_error(e, loc.url(key), client) from None


def _cached_index(client, loc: ObjectLocation, obj: _Object) -> Path:
    """The index object ``obj`` in the local cache (downloaded once per ETag and size)."""
    digest = hashlib.sha1(f"{loc.bucket}/{obj.key}:{obj.etag}:{obj.size}".encode()).hexdigest()[:20]
    path = default_cache_dir() / "s3-index" / f"{digest}-{posixpath.basename(obj.key)}"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(_get(client, loc, obj.key))
        os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------------
# Finding a split
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """What the top of a prefix holds: its objects by name and its sub-folder names."""

    files: dict[str, _Object]
    folders: tuple[str, ...]

    def candidates(self, split: str) -> dict[str, list[_Object] | bool]:
        names = sorted(self.files)
        return {
            "imagefolder": split in self.folders,
            "tfrecord": [self.files[n] for n in names if n.startswith(split) and n.endswith(".tfrecord")],
            "recordio": [self.files[n] for n in names if n == f"{split}.rec"],
            "webdataset": [self.files[n] for n in names if fnmatch.fnmatchcase(n, f"{split}-*.tar")],
            "filelist": f"{split}.txt" in self.files,
        }


def _layout(client, loc: ObjectLocation) -> _Layout:
    top = loc.key() + "/" if loc.prefix else ""
    objects, folders = _list(client, loc, top, delimiter="/")
    if not objects and not folders:
        raise DataError(f"{loc}: no objects under this prefix in bucket {loc.bucket!r}; check the prefix in --data "
                        f"(`aws s3 ls {loc}/` lists what is there)")
    return _Layout({o.key[len(top):]: o for o in objects},
                   tuple(f[len(top):].rstrip("/") for f in folders))


def find_object_splits(url: str, splits: Iterable[str], *, max_depth: int = 3) -> list[tuple[str, str]]:
    """``(dataset URL, split)`` of every split the prefix at ``url`` holds in any layout, or (as
    ``crossdali check`` does for a folder) its sub-prefixes hold, ``max_depth`` levels down."""
    client, splits = s3_client(), tuple(splits)

    def walk(loc: ObjectLocation, depth: int, layout: _Layout | None = None) -> list[tuple[str, str]]:
        layout = layout or _layout(client, loc)
        found = [(str(loc), s) for s in splits if any(layout.candidates(s).values())]
        if found or depth == 0:
            return found
        for sub in layout.folders:
            if not sub.startswith("."):
                found += walk(ObjectLocation(loc.bucket, loc.key(sub)), depth - 1)
        return found

    return walk(ObjectLocation.parse(url), max_depth)


def resolve_object_source(url: str, split: str, *, format: str = "auto", validate: bool = True,
                          exclude: str | os.PathLike | Iterable[str] | Exclusions | None = None,
                          max_pixels: int | None = None):
    """``resolve_source`` for ``s3://bucket/prefix``: the same layouts, the same checks, a
    ``DataSource`` whose files and record paths are ``s3://`` URLs (the index paths are local
    copies in the cache). ``validate`` runs the fast check on the objects' bytes (read into memory,
    never written to disk)."""
    if format not in ("auto", *FORMATS):
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, got {format!r}")
    check_tls_beside_tensorflow(url)
    client, loc = s3_client(), ObjectLocation.parse(url)
    layout = _layout(client, loc)
    candidates = layout.candidates(split)
    chosen = format if format != "auto" else next((f for f, ok in candidates.items() if ok), None)
    if chosen is None or not candidates[chosen]:
        raise DataError(f"no {split} split found in {loc}: looked for {loc}/{split}/ (ImageFolder), "
                        f"{loc}/{split}*.tfrecord, {loc}/{split}.rec, {loc}/{split}-*.tar (WebDataset) and "
                        f"{loc}/{split}.txt")
    exclusions = load_exclusions(exclude)
    settings = CheckSettings(threads=16, **({"max_pixels": max_pixels} if max_pixels else {}))
    if chosen == "imagefolder":
        source = _image_folder(client, loc, split, exclusions)
    elif chosen == "filelist":
        source = _file_list(client, loc, layout.files[f"{split}.txt"], exclusions)
    else:
        source = _records(client, loc, chosen, candidates[chosen], layout, exclusions)
    if validate:
        settings = replace(settings, progress=progress_log(source.num_samples, str(source.root)))
        problems, total = check_object_source(source, settings=settings, client=client)
        if source.paths:
            problems = [p for p in problems if "#" not in p.sample
                        or int(p.sample.rsplit("#", 1)[1]) not in exclusions.excluded_records(p.path)]
        error = problems_error(problems, where=f"{source.root}" + (f" ({split})" if source.paths else ""), total=total,
                               data_hint=shlex.quote(str(loc)))
        if error is not None:
            raise error
    return source


def _image_folder(client, loc: ObjectLocation, split: str, exclusions: Exclusions):
    base = loc.key(split) + "/"
    objects, _ = _list(client, loc, base)
    by_class: dict[str, list[str]] = {}
    for o in objects:
        parts = o.key[len(base):].split("/")
        if len(parts) < 2 or parts[0].startswith("."):
            continue
        names = by_class.setdefault(parts[0], [])
        if len(parts) == 2 and parts[1].lower().endswith(IMAGE_EXTENSIONS):
            names.append(parts[1])
    root = loc.url(loc.key(split))
    if not by_class:
        raise DataError(f"{root} has no class sub-folders; expected {root}/<class>/<image>.jpg (ImageFolder layout)")
    classes = sorted(by_class)
    files, labels = [], []
    for label, cls in enumerate(classes):
        names = sorted(by_class[cls])
        if not names:
            raise DataError(f"class folder {root}/{cls}/ has no images (extensions {', '.join(IMAGE_EXTENSIONS)}); "
                            "remove it or add images: an empty class would shift the labels of the classes after it")
        files += [f"{root}/{cls}/{n}" for n in names]
        labels += [label] * len(names)
    files, labels = apply_exclusions(files, labels, exclusions, root)
    return DataSource(format="imagefolder", root=root, files=tuple(files), labels=tuple(labels),
                      classes=tuple(classes), num_samples=len(files))


def _file_list(client, loc: ObjectLocation, listing: _Object, exclusions: Exclusions):
    list_url = loc.url(listing.key)
    files, labels, lines, keys = [], [], {}, []
    text = _get(client, loc, listing.key).decode("utf-8", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit() or int(parts[1]) < 0:
            raise DataError(f"{list_url}:{lineno}: expected '<path> <non-negative integer label>', got {line!r}")
        key = loc.key(posixpath.normpath(parts[0]))
        files.append(loc.url(key))
        keys.append(key)
        labels.append(int(parts[1]))
        lines.setdefault(files[-1], lineno)
    if not files:
        raise DataError(f"file list {list_url} lists no images")
    files, labels = apply_exclusions(files, labels, exclusions, list_url)
    present = {o.key for o in _list(client, loc, loc.key() + "/" if loc.prefix else "")[0]}
    missing = [f for f in files if f[len(loc.url()) + 1:] not in present]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DataError(f"{list_url}:{lines[missing[0]]}: {missing[0]} does not exist{more}; upload it, remove its line, "
                        "or leave it out with --exclude FILE")
    return DataSource(format="filelist", root=str(loc), files=tuple(files), labels=tuple(labels), num_samples=len(files))


def _records(client, loc: ObjectLocation, fmt: str, records: list[_Object], layout: _Layout, exclusions: Exclusions):
    top = loc.key() + "/" if loc.prefix else ""
    paths, index_paths, n, dropped = [], [], 0, 0
    for rec in records:
        rec_url = loc.url(rec.key)
        idx_name = posixpath.splitext(rec.key[len(top):])[0] + ".idx"
        if rec.size == 0:
            raise DataError(f"record file {rec_url} is empty; rebuild it")
        if idx_name not in layout.files:
            how = {"tfrecord": "tfrecord2idx (ships with DALI): `tfrecord2idx FILE.tfrecord FILE.idx`",
                   "webdataset": "wds2idx (ships with DALI): `wds2idx FILE.tar FILE.idx`",
                   "recordio": "im2rec.py, or mxnet.recordio.MXIndexedRecordIO"}[fmt]
            raise DataError(f"{rec_url} has no index file {loc.url(top + idx_name)}; DALI needs one: create it from a "
                            f"local copy with {how}, and upload it beside the record file")
        if exclusions.excludes_file(rec_url):
            continue
        idx = _cached_index(client, loc, layout.files[idx_name])
        try:
            entries = rec_io.read_index(fmt, idx)
        except rec_io.IndexProblem as e:
            raise DataError(f"{rec_url}: its index {loc.url(top + idx_name)} is malformed ({e}); "
                            f"{rec_io.rebuild_hint(fmt, Path(rec.key).name, Path(idx_name))} and upload it") from None
        skip = exclusions.excluded_records(rec_url) if exclusions else set()
        if skip:
            keep = [e for e in entries if e.position not in skip]
            dropped += len(entries) - len(keep)
            if not keep:
                continue
            filtered = idx.with_name(f"{idx.stem}-{hashlib.sha1(str(sorted(skip)).encode()).hexdigest()[:12]}.idx")
            rec_io.write_index(keep, filtered, fmt=fmt)
            idx, entries = filtered, keep
        paths.append(rec_url)
        index_paths.append(str(idx))
        n += len(entries)
    if exclusions:
        log.warning("%s records of %s: excluded %d records listed in %s", fmt, loc, dropped, exclusions.origin or "exclude=")
    if n == 0:
        raise DataError(f"the index files of {', '.join(loc.url(r.key) for r in records)} list no records"
                        + (" (after the exclusions)" if exclusions else ""))
    return DataSource(format=fmt, root=str(loc), paths=tuple(paths), index_paths=tuple(index_paths), num_samples=n)


# --------------------------------------------------------------------------------------------
# The fast check, on the objects' bytes
# --------------------------------------------------------------------------------------------


def _signature(obj: _Object) -> list[int]:
    return [obj.size, int(hashlib.sha1(obj.etag.encode()).hexdigest()[:15], 16)]


def check_object_source(source, *, settings: CheckSettings, client=None) -> tuple[list[Problem], int]:
    """The fast pass of ``crossdali check`` over a resolved ``s3://`` source: every image's header
    and structure (ImageFolder, file list), or every record's framing and image (record formats),
    read from the store into memory. Results are cached by URL, size and ETag. Returns the problems
    and the number of samples checked."""
    if settings.depth != "fast":
        raise DataError(f"{source.root}: `crossdali check --depth full` reads local files only; check an s3:// "
                        "dataset with --depth fast, or a local copy with --depth full")
    client = client or s3_client()
    if source.paths:
        return _check_records(client, source, settings)
    return _check_images(client, source, settings), len(source.files)


def _objects_of(client, urls: list[str]) -> dict[str, _Object]:
    """The listing entries (size, ETag) of ``urls``, one listing per folder."""
    found: dict[str, _Object] = {}
    folders = sorted({u.rsplit("/", 1)[0] for u in urls})
    for folder in folders:
        loc = ObjectLocation.parse(folder)
        for o in _list(client, loc, loc.key() + "/", delimiter="/")[0]:
            found[loc.url(o.key)] = o
    return found


def _check_images(client, source, settings: CheckSettings) -> list[Problem]:
    # sample ids relative to the dataset, as for a local folder: an ImageFolder's root is its split
    root = str(source.root).rsplit("/", 1)[0] if source.format == "imagefolder" else str(source.root)
    cache = settings.cache(f"s3files:{root}")
    objects = _objects_of(client, list(source.files))
    infos = {}
    todo = []
    for url in source.files:
        obj = objects.get(url)
        entry = cache.get(url, _signature(obj)) if obj else None
        if entry is not None and "info" in entry:
            from crossdali.common.data.check.images import ImageInfo

            infos[url] = ImageInfo.from_json(entry["info"])
            settings.tick(1)
        else:
            todo.append(url)

    def inspect(url: str):
        loc = ObjectLocation.parse(url)
        data = _get(client, loc, loc.prefix)
        return inspect_image(data, extension=posixpath.splitext(url)[1])

    with ThreadPoolExecutor(max(1, settings.threads)) as pool:
        for url, info in zip(todo, pool.map(inspect, todo)):
            infos[url] = info
            settings.tick(1)
            if url in objects:
                cache.put(url, _signature(objects[url]), info=info.to_json())
    cache.save()
    problems = []
    for url in source.files:
        info = infos[url]
        sid = url[len(root) + 1:] if url.startswith(root + "/") else url
        for code, text in info.problems:
            problems.append(_problem(sid, url, code, text))
        too_large = _size_problem(info.pixels, info.width, info.height, settings) if info.format else None
        if too_large:
            problems.append(_problem(sid, url, "too-large", too_large))
    return problems


class _RangeReader:
    """Bytes of one object by offset, fetched in windows of ``window`` bytes (records are read in
    offset order, so each window is fetched once)."""

    def __init__(self, client, url: str, size: int, window: int = 16 << 20) -> None:
        self.client, self.loc, self.size, self.window = client, ObjectLocation.parse(url), size, window
        self._start, self._data = 0, b""

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.size)
        if not (self._start <= offset and end <= self._start + len(self._data)):
            self._start = offset
            self._data = _get(self.client, self.loc, self.loc.prefix, (offset, min(self.size, offset + max(length, self.window))))
        return self._data[offset - self._start:end - self._start]


def _record_payload(fmt: str, reader: _RangeReader, entry) -> tuple[object | None, str | None]:
    """The payload of one indexed record, or what is wrong with where the index puts it."""
    if fmt == "webdataset":
        payload = {}
        for ext, offset, length, name in entry.components:
            if offset < 512 or offset + length > reader.size:
                return None, f"lists {name or ext} at bytes {offset}-{offset + length}, past the end of the file"
            try:
                info = tarfile.TarInfo.frombuf(reader.read(offset - 512, 512), "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                info = None
            if info is None or info.size != length or (name and not name.endswith(info.name.lstrip("./"))):
                return None, f"puts {name or ext} ({length} bytes) at byte {offset}, but the tar has another member there"
            payload[ext] = reader.read(offset, length)
        return payload, None
    framed = rec_io._frame(fmt, reader.read(entry.offset, 12), entry, reader.size)
    if isinstance(framed, str):
        return None, f"is not at byte {entry.offset}, where the index puts it ({framed})"
    start, length = framed
    trailer = 4 if fmt == "tfrecord" else 0
    if entry.offset + start + length + trailer > reader.size:
        return None, f"is truncated: the object ends before byte {entry.offset + start + length + trailer}"
    body = reader.read(entry.offset + start, length + trailer)
    if fmt == "tfrecord":
        import crc32c

        if rec_io._masked(crc32c.crc32c(body[:length])) != int.from_bytes(body[length:], "little"):
            return None, "corrupt:fails its data checksum"
    return body[:length], None


def _check_records(client, source, settings: CheckSettings) -> tuple[list[Problem], int]:
    fmt, root = source.format, str(source.root)
    objects = _objects_of(client, list(source.paths))
    problems, total = [], 0
    for url, idx in zip(source.paths, source.index_paths):
        obj = objects.get(url)
        if obj is None:
            raise DataError(f"{url} does not exist any more; run the command again")
        rel = url[len(root) + 1:] if url.startswith(root + "/") else url
        entries = rec_io.read_index(fmt, Path(idx))
        total += len(entries)
        cache = settings.cache(f"s3records:{fmt}:{url}")
        sig = _signature(obj) + [int(hashlib.sha1(Path(idx).read_bytes()).hexdigest()[:15], 16)]
        scan = cache.get("scan", sig)
        if scan is None:
            scan = {"file": [], "records": []}
            offsets = [e.offset for e in entries]
            if offsets != sorted(offsets) or len(set(offsets)) != len(offsets):
                scan["file"].append(["bad-index", "has an index whose offsets are not strictly increasing: "
                                                  f"{rec_io.rebuild_hint(fmt, Path(rel), Path(rel).with_suffix('.idx'))}"])
            reader = _RangeReader(client, url, obj.size)
            for entry in entries if not scan["file"] else ():
                payload, problem = _record_payload(fmt, reader, entry)
                if problem is not None:
                    code, _, text = problem.partition(":") if problem.startswith("corrupt:") else ("bad-record", "", problem)
                    scan["records"].append([entry.position, code, text])
                    continue
                try:
                    image, label = rec_io.record_image(fmt, payload, image_key="image/encoded", label_key="image/class/label")
                except (ValueError, IndexError) as e:
                    scan["records"].append([entry.position, "bad-record", f"is not a valid record ({e})"])
                    continue
                if image is None:
                    scan["records"].append([entry.position, "bad-record", "has no image"])
                    continue
                if label is None and fmt in ("tfrecord", "webdataset"):
                    scan["records"].append([entry.position, "no-label", "has no label"])
                info = inspect_image(image)
                scan["records"] += [[entry.position, code, text] for code, text in info.problems]
                too_large = _size_problem(info.pixels, info.width, info.height, settings) if info.format else None
                if too_large:
                    scan["records"].append([entry.position, "too-large", too_large])
            cache.put("scan", sig, **scan)
            cache.save()
        settings.tick(len(entries))
        for code, text in scan["file"]:
            problems.append(_problem(rel, url, code, text))
        for pos, code, text in scan["records"]:
            problems.append(_problem(f"{rel}#{pos}", f"{url} record #{pos}", code, text, path=url))
    return problems, total
