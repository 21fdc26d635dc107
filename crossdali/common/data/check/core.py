"""Checking samples: the fast pass (headers, structure, indexes, annotations) and the full pass
(DALI decodes everything, warnings count as errors), per source type, with the cache.

Every function returns ``Problem`` rows; ``crossdali.common.data.check.report`` turns them into the
JSON report and the exclusion list, ``crossdali.common.data.sources`` and friends into a ``DataError``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import multiprocessing
import os
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from crossdali.common.data.check import records as rec_io
from crossdali.common.data.check.cache import CheckCache, file_signature
from crossdali.common.data.check.decode import decode_file_list, decode_files, decode_samples, gpu_available
from crossdali.common.data.check.images import DEFAULT_MAX_PIXELS, ImageInfo, inspect_image
from crossdali.common.data.formats import WEBDATASET_IMAGE_EXTENSIONS
from crossdali.common.errors import DataError

__all__ = ["CheckSettings", "Problem", "check_image_files", "check_record_files", "sample_id", "problems_error",
           "resolve_device", "progress_log"]

log = logging.getLogger(__name__)

DEPTHS = ("fast", "full")

#: Devices whose full pass reads every header first and then decodes the files that passed through
#: DALI's file reader (``decode_file_list``) instead of decoding while headers are read
#: (``decode_files``): on a GPU DALI's file reader feeds the decoder faster than file names fed to
#: ``fn.io.file.read``, which outweighs reading the headers first (docs/benchmarks.md#check-speed;
#: ``python -m benchmarks.probes.dali_read_paths`` compares the two). On a small CPU the decode is
#: the bottleneck and reading headers beside it is worth more.
FILE_READER_DEVICES = ("gpu",)

_FIXES = {
    "unreadable": "check its permissions, the file system, or where its symbolic link points; or remove it",
    "empty": "re-download or re-encode it from the original, or remove it",
    "not-an-image": "replace it with the real image, or remove it",
    "unsupported-format": "convert it (e.g. `python -c \"from PIL import Image; Image.open('IN').convert('RGB')"
                          ".save('OUT.jpg')\"`) or remove it",
    "truncated": "re-download or re-encode it from the original, or remove it",
    "corrupt": "re-encode it from the original, or remove it",
    "too-large": "downscale it (e.g. `python -c \"from PIL import Image; im = Image.open('IN'); im.thumbnail((8192, 8192)); "
                 "im.save('OUT.jpg')\"`), remove it, or raise --max-pixels if such images are real",
    "decode-failed": "re-encode it from the original, or remove it",
    "decoder-warning": "re-encode it from the original, or remove it (the decoder would output damaged pixels "
                       "without stopping)",
    "no-label": "write the label into the record, or rebuild the records",
    "bad-record": "rebuild the record file and its index",
}


@dataclass(frozen=True)
class CheckSettings:
    """How deep and how strict: ``depth`` fast (no full-size decode) or full (DALI decodes every sample on
    ``device``); ``max_pixels`` refuses larger headers before anything is decoded."""

    depth: str = "fast"
    device: str = "cpu"
    max_pixels: int = DEFAULT_MAX_PIXELS
    threads: int = 4
    #: processes that inspect headers (the fast pass is pure Python, bound by the GIL at about 3,000
    #: files/s whatever the threads); ``None``: for 4,096 files or more on more than 4 cores, every
    #: core up to 16 when the headers are read alone (the fast pass; the file reader's full pass reads
    #: them all first), half of them when DALI decodes beside them; else none (starting them costs
    #: about a second)
    processes: int | None = None
    batch_size: int = 32
    cache_dir: str | None = None
    use_cache: bool = True
    progress: Callable[[int], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.depth not in DEPTHS:
            raise ValueError(f"depth must be one of {DEPTHS}, got {self.depth!r}")
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be 'cpu' or 'gpu', got {self.device!r}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, got {self.max_pixels}")
        if self.processes is not None and self.processes < 0:
            raise ValueError(f"processes must be 0 or more, got {self.processes}")

    def inspect_processes(self, files: int) -> int:
        if self.processes is not None:
            return self.processes
        cores = os.cpu_count() or 1
        if cores <= 4 or files < 4096:
            return 0
        # Header reading scales with the cores; with a decoder working beside it (the full pass on the
        # CPU) half of them are left to the decoder.
        decoding_beside = self.depth == "full" and self.device not in FILE_READER_DEVICES
        return min(cores // 2 if decoding_beside else cores, 16)

    def cache(self, identity: str) -> CheckCache:
        return CheckCache(identity, cache_dir=self.cache_dir, enabled=self.use_cache)

    def tick(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)


#: seconds between the progress lines of the check before training (``progress_log``)
PROGRESS_EVERY_S = 10.0


def progress_log(total: int, what: str, *, every_s: float | None = None) -> Callable[[int], None]:
    """A ``CheckSettings.progress`` that logs one INFO line every ``every_s`` seconds (default
    ``PROGRESS_EVERY_S``): the first check of a large dataset before training (every header read, from disk
    or an object store) is otherwise a silent wait. A cached check ends before its first line."""
    every_s = PROGRESS_EVERY_S if every_s is None else every_s
    lock, start = threading.Lock(), time.monotonic()
    state = {"done": 0, "last": start}

    def tick(n: int) -> None:
        with lock:
            state["done"] += n
            now = time.monotonic()
            if now - state["last"] < every_s:
                return
            state["last"] = now
            done, rate = state["done"], state["done"] / max(now - start, 1e-9)
        left = f", about {(total - done) / rate:.0f} s left" if rate > 0 and done < total else ""
        log.info("checking %s: %s of %s samples (%.0f/s%s; cached for the next run)", what, f"{done:,}",
                 f"{total:,}", rate, left)

    return tick


def default_threads() -> int:
    """Header-reading and DALI threads when the user gives none: every core, up to 16 (more threads
    than cores only contend)."""
    return max(1, min(os.cpu_count() or 1, 16))


def default_batch_size(device: str) -> int:
    """Samples per DALI batch in the full pass when the user gives none: 64 on a GPU, where the
    decoder works through a batch at once, 32 on the CPU (two batches of 12-megapixel photos in
    flight stay near 2 GB of decoded pixels there)."""
    return 64 if device == "gpu" else 32


def resolve_device(device: str) -> str:
    """``auto``: the GPU when DALI sees one (training decodes there), else the CPU."""
    if device == "auto":
        return "gpu" if gpu_available() else "cpu"
    return device


@dataclass(frozen=True)
class Problem:
    """One bad sample (or file): ``sample`` is its id in the exclusion list, ``message`` names the
    file, what is wrong and the fix. ``severity`` ``warning`` is reported but never refused."""

    sample: str
    path: str
    code: str
    message: str
    severity: str = "error"
    depth: str = "fast"

    def to_json(self) -> dict:
        return asdict(self)


def sample_id(path: str | os.PathLike, root: str | os.PathLike | None, *, absolute: str | None = None) -> str:
    """``path`` relative to ``root`` (posix), or as given when it lies elsewhere. ``absolute``:
    ``os.path.abspath(path)`` where the caller has it (a million files: the main thread's time)."""
    if root is None:
        return Path(path).as_posix()
    absolute = absolute or os.path.abspath(path)
    prefix = os.path.join(os.path.abspath(root), "")
    if absolute.startswith(prefix):  # what relpath gives, without its per-call normalising
        return Path(absolute[len(prefix):]).as_posix() if os.sep != "/" else absolute[len(prefix):]
    return Path(path).as_posix()


def _problem(sample: str, where: str, code: str, text: str, *, depth: str = "fast", severity: str = "error",
             path: str | None = None) -> Problem:
    fix = _FIXES.get(code)
    if code in ("truncated", "corrupt"):
        text = f"cannot be decoded: it {text}"
    elif code == "decode-failed":
        text = f"cannot be decoded: {text}"
    message = f"{where} {text}" + (f"; {fix}" if fix and severity == "error" and code != "misnamed" else "")
    return Problem(sample=sample, path=path or where, code=code, message=message, severity=severity, depth=depth)


def _size_problem(info_pixels: int, width: int, height: int, settings: CheckSettings) -> str | None:
    if info_pixels > settings.max_pixels:
        dims = f"{width}x{height} = {info_pixels:,} pixels" if height > 1 else f"{info_pixels:,} pixels"
        return (f"has a header that claims {dims}, over the limit of {settings.max_pixels:,} (--max-pixels): decoding it "
                f"would allocate {info_pixels * 3 / 2**30:.1f} GiB")
    return None


# --------------------------------------------------------------------------------------------
# Image files (ImageFolder, file lists, COCO images)
# --------------------------------------------------------------------------------------------


def _unreadable(error: OSError) -> str:
    """Why a sample could not be opened, in words (a symbolic link loop says so)."""
    if error.errno == errno.ELOOP:
        return f"is a symbolic link that never reaches a file ({error.strerror})"
    return f"cannot be read ({error.strerror or error})"


def _inspect_one(path: str) -> tuple[ImageInfo, list[int] | None, str]:
    """(the file's header, its cache signature or ``None`` when it could not be read, its absolute
    path: the cache's key). The signature comes from the open file (``fstat``), so a file never
    needs a ``stat`` of its own in the main process, where tens of thousands of them add up to a
    visible share of a fast pass."""
    absolute = os.path.abspath(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
    except OSError as e:
        return ImageInfo(problems=[("unreadable", _unreadable(e))]), None, absolute
    return inspect_image(data, extension=os.path.splitext(path)[1]), [st.st_size, st.st_mtime_ns], absolute


def _inspect_many(paths: list[str]) -> list[tuple[ImageInfo, list[int] | None, str]]:
    """In a worker process: :func:`_inspect_one` of each file."""
    return [_inspect_one(path) for path in paths]


#: Files whose headers may be read ahead of the one the full pass decodes (their results, about 200
#: bytes each, wait in memory); benchmarks.check_speed --read-ahead varies it.
HEADER_READ_AHEAD = 8192


def _bounded_map(pool: Executor, fn: Callable, items: Iterable, window: int) -> Iterator:
    """``pool.map(fn, items)`` with at most ``window`` items in flight: ``Executor.map`` submits
    everything at once, and the full pass would then hold every file of the data set in memory."""
    it = iter(items)
    futures = deque(pool.submit(fn, item) for item in itertools.islice(it, window))
    while futures:
        result = futures.popleft().result()
        for item in itertools.islice(it, 1):
            futures.append(pool.submit(fn, item))
        yield result


def check_image_files(files: Sequence[str], *, root: str | os.PathLike | None, settings: CheckSettings,
                      identity: str | None = None) -> tuple[list[Problem], dict[str, ImageInfo]]:
    """Problems of image files, and the header of each file that has one (for COCO's size check).

    ``root``: sample ids are relative to it. ``identity`` names the cache (default: the files' folder).
    Headers are read by threads, or by worker processes with ``settings.processes`` (by default
    on many cores and many files); in the full pass each file whose header passed goes on to DALI,
    which reads and decodes it (``check.decode.decode_files``) while later headers are read.
    """
    cache = settings.cache(identity or f"files:{os.path.abspath(root or os.path.dirname(files[0]) if files else '')}")
    full_depth = settings.depth == "full"
    infos: dict[str, ImageInfo] = {}
    full: dict[str, list] = {}  # [code, text], or [] when the decoder was happy
    sigs: dict[str, list[int]] = {}
    todo = []
    absolute: dict[str, str] = {}  # the cache's keys
    # An empty cache (a first check, or none) answers nothing: every file goes straight to the
    # header readers, which take its signature and key from the open file, off this thread.
    consult_cache = len(cache) > 0
    for path in files:
        if not consult_cache:
            todo.append(path)
            continue
        absolute[path] = os.path.abspath(path)
        try:
            sigs[path] = file_signature(path)
        except OSError as e:
            infos[path] = ImageInfo(problems=[("unreadable", _unreadable(e))])
            settings.tick(1)
            continue
        entry = cache.get(absolute[path], sigs[path])
        if entry is not None and "info" in entry:
            infos[path] = ImageInfo.from_json(entry["info"])
            if entry.get("full") is not None:
                full[path] = entry["full"]
        if path not in infos or (full_depth and path not in full):
            todo.append(path)
        else:
            settings.tick(1)

    def refused(path: str) -> bool:
        info = infos[path]
        return bool(info.problems) or (bool(info.format) and info.pixels > settings.max_pixels)

    def inspected(need: list[str]) -> Iterator[tuple[ImageInfo, list[int] | None, str]]:
        """:func:`_inspect_one` of each file of ``need``, in order."""
        processes = settings.inspect_processes(len(need))
        if not processes:
            with ThreadPoolExecutor(max(1, settings.threads)) as threads:
                yield from _bounded_map(threads, _inspect_one, need, HEADER_READ_AHEAD)
            return
        # In worker processes, a chunk each. Forked (a spawned worker re-runs a user script that
        # lacks the `if __name__ == "__main__"` guard): the pool starts before this call builds its
        # decoder, and crossdali.common.loading.fork_safety keeps dead pipelines out of the children.
        chunks = [need[i:i + 256] for i in range(0, len(need), 256)]
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context(method)) as pool:
            for results in _bounded_map(pool, _inspect_many, chunks, max(2 * processes, HEADER_READ_AHEAD // 256)):
                yield from results

    decoded: list[str] = []
    # Files refused from their header are counted on the progress bar with the next decoded chunk:
    # the decoder captures file descriptor 2 while this generator runs, and a bar drawn meanwhile
    # would look like a decoder's warning (the chunk would then be decoded again, batch by batch).
    refused_uncounted = 0

    def counted(n: int) -> None:
        nonlocal refused_uncounted
        settings.tick(n + refused_uncounted)
        refused_uncounted = 0

    def to_decode() -> Iterator[str]:
        """Each file of ``todo`` as its header arrives: the refused ones counted, the rest yielded."""
        nonlocal refused_uncounted
        headers = inspected([p for p in todo if p not in infos])  # in the order of todo
        for path in todo:
            if path not in infos:
                infos[path], sig, absolute[path] = next(headers)
                if sig is not None:  # an unreadable file is tried again next time (chmod leaves mtime alone)
                    sigs[path] = sig
                    if cache.enabled:
                        cache.put(absolute[path], sig, info=infos[path].to_json())
            if not full_depth:
                settings.tick(1)
            elif refused(path):
                refused_uncounted += 1
            else:
                decoded.append(path)
                yield path

    if full_depth:
        if settings.device in FILE_READER_DEVICES:  # every header first, then DALI's file reader
            bad = decode_file_list(list(to_decode()), device=settings.device, batch_size=settings.batch_size,
                                   threads=settings.threads, on_batch=counted)
        else:  # DALI decodes the first files while later headers are still being read
            bad = decode_files(to_decode(), device=settings.device, batch_size=settings.batch_size,
                               threads=settings.threads, on_batch=counted)
        counted(0)
        for path in decoded:
            full[path] = list(bad.get(path, ()))
            cache.put(absolute[path], sigs[path], full=full[path])
    else:
        for _ in to_decode():
            pass
    problems = []
    for path in files:  # sample ids only for the files with a problem (a million files: seconds)
        info = infos[path]
        too_large = _size_problem(info.pixels, info.width, info.height, settings) if info.format else None
        found_before = not full_depth and full.get(path)  # a full pass found more: still true
        if not (info.problems or too_large or found_before):
            continue
        sid = sample_id(path, root, absolute=absolute[path])
        for code, text in info.problems:
            problems.append(_problem(sid, path, code, text))
        if too_large:
            problems.append(_problem(sid, path, "too-large", too_large))
        if found_before:
            problems.append(_problem(sid, path, *full[path], depth="full"))
    if full_depth:
        for path in files:
            if full.get(path):
                problems.append(_problem(sample_id(path, root, absolute=absolute[path]), path, *full[path],
                                         depth="full"))
    cache.save()
    return problems, infos


# --------------------------------------------------------------------------------------------
# Record files (TFRecord, RecordIO) through their index
# --------------------------------------------------------------------------------------------


def _scan_records(fmt: str, rec: Path, idx: Path, *, image_key: str, label_key: str, on_record) -> dict:
    """One pass over a record file: index problems, per-record problems and sizes (setting-independent)."""
    try:
        entries = rec_io.read_index(fmt, idx)
    except rec_io.IndexProblem as e:
        return {"file": [["bad-index", str(e)]], "records": [], "pixels": [], "count": 0}
    file_problems = [["bad-index", p] for p in rec_io.check_index(fmt, rec, idx, entries)]
    record_problems: list[list] = []
    pixels = [0] * len(entries)
    misplaced, cut, gaps = [], [], []
    for entry, payload, problem in rec_io.iter_records(fmt, rec, entries):
        if problem is not None:
            kind, _, text = problem.partition(":")
            if kind == "gap":
                gaps.append((entry.offset, int(text)))
            elif kind == "frame" and ("past the end of the file" in text or text.startswith("is truncated")):
                cut.append((entry, text))
            elif kind == "frame":
                misplaced.append((entry, text))
            else:
                record_problems.append([entry.position, "corrupt", text])
                on_record(1)
            continue
        on_record(1)
        try:
            image, label = rec_io.record_image(fmt, payload, image_key=image_key, label_key=label_key)
        except (ValueError, IndexError) as e:
            record_problems.append([entry.position, "bad-record", f"is not a valid record ({e})"])
            continue
        if image is None:
            what = (f"no image ({', '.join('.' + x for x in WEBDATASET_IMAGE_EXTENSIONS)}) among its files "
                    f"{', '.join(sorted(payload))}" if fmt == "webdataset" else f"no {image_key!r} feature")
            record_problems.append([entry.position, "bad-record", f"has {what}"])
            continue
        if label is None and fmt == "tfrecord":
            record_problems.append([entry.position, "no-label", f"has no {label_key!r} feature (DALI would use -1)"])
        if label is None and fmt == "webdataset":
            record_problems.append([entry.position, "no-label", "has no .cls file (its class index as text)"])
        info = inspect_image(image)
        pixels[entry.position] = info.pixels
        for code, text in info.problems:
            record_problems.append([entry.position, code, text])
        if info.pixels and info.height > 0:
            record_problems.append([entry.position, "_size", f"{info.width}x{info.height}"])
    hint = rec_io.rebuild_hint(fmt, rec, idx)
    if cut and not misplaced and not any(offset < cut[0][0].offset for offset, _ in gaps):
        # the file ends early and every record before the cut is where its index says, back to back:
        # the lost records are bad samples of their own, and the intact ones stay usable once the
        # exclusion list leaves those out (the bytes of the record cut in two are no gap of the index)
        for entry, text in cut:
            record_problems.append([entry.position, "truncated", f"{text}: the file was cut short; its records "
                                                                 "before this one are intact"])
        gaps = []
    else:  # an index that points elsewhere too: stale, the whole file is suspect
        misplaced = sorted(misplaced + cut, key=lambda m: m[0].position)
    gaps = sum(n for _, n in gaps)
    if misplaced:
        first, text = misplaced[0]
        line = first.position + (2 if fmt == "webdataset" else 1)  # a WebDataset index starts with a header line
        file_problems.append(["bad-index", f"does not match its index {idx}: {len(misplaced)} of {len(entries)} records "
                                           f"are not where it says (the first, line {line}, {text}); the "
                                           f"index is stale or belongs to another file: {hint}"])
    elif gaps and not file_problems:
        file_problems.append(["bad-index", f"has {gaps} bytes that no line of its index {idx} covers: the records there "
                                           f"are never read (a stale or incomplete index): {hint}"])
    return {"file": file_problems, "records": record_problems, "pixels": pixels, "count": len(entries)}


def _record_images(fmt: str, rec: Path, idx: Path, positions: set[int], *, image_key: str, label_key: str):
    entries = [e for e in rec_io.read_index(fmt, idx) if e.position in positions]
    for entry, payload, _ in rec_io.iter_records(fmt, rec, entries):
        if entry.position < 0 or payload is None:
            continue
        try:
            image, _ = rec_io.record_image(fmt, payload, image_key=image_key, label_key=label_key)
        except ValueError:  # a bad label: the fast pass reports it
            continue
        if image is not None:
            yield str(entry.position), image


def check_record_files(fmt: str, paths: Sequence[str], index_paths: Sequence[str], *, root: str | os.PathLike | None,
                       settings: CheckSettings, image_key: str = "image/encoded",
                       label_key: str = "image/class/label") -> tuple[list[Problem], int]:
    """Problems of TFRecord/RecordIO files and their indexes; and how many records the indexes list."""
    problems: list[Problem] = []
    total = 0
    for path, index in zip(paths, index_paths):
        rec, idx = Path(path), Path(index)
        rel = sample_id(rec, root)
        cache = settings.cache(f"records:{fmt}:{rec.resolve()}:{idx.resolve()}")
        sig = file_signature(rec, idx)
        entry = cache.get("scan", sig)
        if entry is None:
            scan = _scan_records(fmt, rec, idx, image_key=image_key, label_key=label_key,
                                 on_record=settings.tick if settings.depth == "fast" else (lambda n: None))
            cache.put("scan", sig, **scan)
        else:
            scan = entry
            if settings.depth == "fast":
                settings.tick(scan["count"])
        total += scan["count"]
        for code, text in scan["file"]:
            problems.append(_problem(rel, str(rec), code, text))
        sizes = {}
        for pos, code, text in scan["records"]:
            if code == "_size":
                sizes[pos] = text
                continue
            problems.append(_problem(f"{rel}#{pos}", f"{rec} record #{pos}", code, text, path=str(rec)))
        for pos, pixels in enumerate(scan["pixels"]):
            if pixels > settings.max_pixels:
                w, h = (int(v) for v in sizes.get(pos, f"{pixels}x1").split("x"))
                problems.append(_problem(f"{rel}#{pos}", f"{rec} record #{pos}", "too-large",
                                         _size_problem(pixels, w, h, settings), path=str(rec)))
        if settings.depth == "full":
            refused = {int(p.sample.rsplit("#", 1)[1]) for p in problems if p.path == str(rec) and "#" in p.sample}
            if any(p.sample == rel for p in problems):  # the index itself is broken: decoding would read garbage
                settings.tick(scan["count"])
                continue
            full_entry = cache.get("scan", sig, depth="full")
            if full_entry is not None:
                bad = {int(k): v for k, v in full_entry["full"].items()}
                settings.tick(scan["count"])
            else:
                positions = set(range(scan["count"])) - refused
                decoded = decode_samples(_record_images(fmt, rec, idx, positions, image_key=image_key, label_key=label_key),
                                         device=settings.device, batch_size=settings.batch_size,
                                         threads=settings.threads, on_batch=settings.tick)
                settings.tick(len(refused))
                bad = {int(k): v for k, v in decoded.items()}
                cache.put("scan", sig, full={str(k): list(v) for k, v in bad.items()})
            for pos, (code, text) in sorted(bad.items()):
                problems.append(_problem(f"{rel}#{pos}", f"{rec} record #{pos}", code, text, depth="full",
                                         path=str(rec)))
        cache.save()
    return problems, total


def problems_error(problems: Sequence[Problem], *, where: str, total: int, data_hint: str | None = None):
    """A ``DataError`` summarising the errors among ``problems`` (``None`` if there are none)."""
    errors = [p for p in problems if p.severity == "error"]
    if not errors:
        return None
    target = data_hint or shlex.quote(where)  # a data_hint is a command line's arguments, quoted by the caller
    fix = (f"`crossdali check {target}` lists every bad sample and writes an exclusion list to pass as "
           "--exclude FILE (exclude= in the loader factories)")
    if len(errors) == 1:  # the common case stays one line: the file, what is wrong, the fix
        return DataError(f"{errors[0].message}. Or train without it: {fix}")
    listed = "; ".join(p.message for p in errors[:3]) + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
    return DataError(f"{len(errors)} of {total} samples in {where} cannot be used: {listed}. "
                     f"Fix or remove them, or train on the rest: {fix}")
