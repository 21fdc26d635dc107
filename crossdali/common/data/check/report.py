"""Checking whole datasets: find every split and format under a folder, check each, and write
the JSON report and the exclusion list; ``check_before_training`` for the training scripts."""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from crossdali.common.data.check.core import (
    CheckSettings,
    Problem,
    check_image_files,
    check_record_files,
    default_batch_size,
    default_threads,
    problems_error,
    resolve_device,
    sample_id,
)
from crossdali.common.data.check.exclude import format_exclusions
from crossdali.common.data.coco import DetectionSource, coco_problems, resolve_detection_source
from crossdali.common.data.object_store import check_object_source, find_object_splits, is_object_url, resolve_object_source
from crossdali.common.data.sources import DataSource, read_file_list, resolve_source
from crossdali.common.data.videos import resolve_video_source, video_problems
from crossdali.common.errors import DataError
from crossdali.common.files import write_text_atomically

__all__ = ["Report", "SplitReport", "check_before_training", "check_data", "check_source", "discover"]

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "validation", "test")
_VIDEO_EXT = (".webm", ".mp4", ".mkv", ".avi", ".mov", ".m4v")


@dataclass
class SplitReport:
    """One split of one dataset: what was checked and what is wrong with it."""

    kind: str  # classification | detection | video
    format: str
    split: str
    location: str
    num_samples: int
    problems: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def to_json(self) -> dict:
        return {"kind": self.kind, "format": self.format, "split": self.split, "location": self.location,
                "num_samples": self.num_samples, "num_errors": len(self.errors),
                "num_warnings": len(self.problems) - len(self.errors), "seconds": round(self.seconds, 3),
                "problems": [p.to_json() for p in self.problems]}


@dataclass
class Report:
    data: str
    depth: str
    device: str
    max_pixels: int
    splits: list[SplitReport] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for s in self.splits for p in s.errors]

    @property
    def num_samples(self) -> int:
        return sum(s.num_samples for s in self.splits)

    def to_json(self) -> dict:
        return {"data": self.data, "depth": self.depth, "device": self.device, "max_pixels": self.max_pixels,
                "num_samples": self.num_samples, "num_errors": len(self.errors),
                "splits": [s.to_json() for s in self.splits]}

    def exclusion_text(self) -> str:
        rows = {p.sample: f"{p.code}: {p.message}" for p in self.errors}
        return format_exclusions(sorted(rows.items()), header=(
            f"crossdali check {self.data} --depth {self.depth}: {len(rows)} sample{'' if len(rows) == 1 else 's'} to leave out.\n"
            "Pass this file as --exclude to a training script, or exclude= to a loader factory."))

    def write(self, out: str | os.PathLike) -> tuple[Path, Path]:
        """``report.json`` and ``exclude.txt`` in ``out``, each written whole or not at all (``WriteError``
        naming the file and the cause otherwise; a previous file stays as it was)."""
        out = Path(out)
        report = write_text_atomically(out / "report.json", json.dumps(self.to_json(), indent=1) + "\n",
                                       what="check report")
        exclude = write_text_atomically(out / "exclude.txt", self.exclusion_text(), what="exclusion list")
        return report, exclude


# --------------------------------------------------------------------------------------------
# What to check under a folder
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    kind: str
    folder: Path
    split: str


def _listed_ext(list_file: Path) -> str:
    for line in list_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.strip():
            return os.path.splitext(line.rsplit(maxsplit=1)[0])[1].lower()
    return ""


def _is_video_folder(folder: Path) -> bool:
    for cls in folder.iterdir() if folder.is_dir() else ():
        if cls.is_dir():
            for f in cls.iterdir():
                return f.suffix.lower() in _VIDEO_EXT
    return False


def _targets_in(folder: Path) -> list[Target]:
    found = []
    ann = folder / "annotations"
    if ann.is_dir():
        for f in sorted(ann.glob("instances_*.json")):
            split = f.stem[len("instances_"):]
            found.append(Target("detection", folder, split.removesuffix("2017").removesuffix("2014")))
        return found
    for split in SPLITS:
        listed = folder / f"{split}.txt"
        if (folder / split).is_dir():
            kind = "video" if _is_video_folder(folder / split) else "classification"
        elif listed.is_file():
            kind = "video" if _listed_ext(listed) in _VIDEO_EXT else "classification"
        elif (list(folder.glob(f"{split}*.tfrecord")) or (folder / f"{split}.rec").is_file()
              or list(folder.glob(f"{split}-*.tar"))):
            kind = "classification"
        else:
            continue
        found.append(Target(kind, folder, split))
    return found


def discover(data: str | os.PathLike, *, max_depth: int = 3) -> list[Target]:
    """Every dataset split under ``data``: the folder itself, or its sub-folders (the sample sets
    keep classification/imagefolder, classification/tfrecord, detection, video side by side)."""
    data = Path(data)
    if not data.exists():
        raise DataError(f"{data} does not exist; pass the dataset folder to check")
    if data.is_file():
        kind = "video" if _listed_ext(data) in _VIDEO_EXT else "classification"
        return [Target(kind, data, data.stem)]
    found = _targets_in(data)
    if found or max_depth == 0:
        return found
    for sub in sorted(p for p in data.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found += discover(sub, max_depth=max_depth - 1)
    return found


# --------------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------------


def check_source(source, *, settings: CheckSettings, root: str | os.PathLike | None = None, split: str = "",
                 transform=None) -> SplitReport:
    """Check one resolved source (``DataSource`` of images, records or videos, or ``DetectionSource``)."""
    start = time.perf_counter()
    root = Path(root) if root is not None else None
    if isinstance(source, DetectionSource):
        coco = json.loads(Path(source.annotations_file).read_text(encoding="utf-8"))
        files = sorted({str(source.file_root / str(im["file_name"])) for im in coco["images"]
                        if (source.file_root / str(im["file_name"])).is_file()})
        problems, infos = check_image_files(files, root=root, settings=settings)
        problems = coco_problems(coco, Path(source.annotations_file), source.file_root, root=root,
                                 image_infos=infos) + problems
        report = SplitReport("detection", "coco", split or source.split, str(source.annotations_file),
                             len(coco["images"]), problems)
    elif source.format in ("tfrecord", "recordio", "webdataset"):
        problems, total = check_record_files(source.format, source.paths, source.index_paths, root=root, settings=settings)
        report = SplitReport("classification", source.format, split, ", ".join(source.paths), total, problems)
    elif getattr(source, "files", None) and os.path.splitext(source.files[0])[1].lower() in _VIDEO_EXT:
        report = _check_videos(source, settings=settings, root=root, split=split, transform=transform)
    else:
        problems, _ = check_image_files(list(source.files), root=root, settings=settings)
        report = SplitReport("classification", source.format, split, str(source.root), len(source.files), problems)
    report.seconds = time.perf_counter() - start
    return report


def _check_videos(source: DataSource, *, settings: CheckSettings, root, split: str, transform) -> SplitReport:
    found = video_problems(source.files, device=settings.device, transform=transform, threads=settings.threads)
    settings.tick(len(source.files))
    problems = [Problem(sample_id(path, root), path, code, message) for path, code, message in found]
    if settings.depth == "full":
        refused = {p.path for p in problems}
        problems += _decode_videos([f for f in source.files if f not in refused], settings=settings, root=root)
    return SplitReport("video", "video", split, str(source.root), len(source.files), problems)


def _decode_videos(files: Sequence[str], *, settings: CheckSettings, root) -> list[Problem]:
    """Full pass for videos: DALI's video decoder over every frame of each file (stderr captured)."""
    from nvidia.dali import fn, pipeline_def, types

    from crossdali.common.data.check.decode import capture_stderr, describe_dali_error

    gpu = settings.device == "gpu"

    @pipeline_def(batch_size=1, num_threads=max(1, settings.threads), device_id=0 if gpu else None,
                  prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
    def decode():
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        return fn.decoders.video(encoded, device="mixed" if gpu else "cpu")

    import numpy as np

    problems, pipe = [], None
    for path in files:
        if pipe is None:
            pipe = decode()
            pipe.build()
        with open(path, "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
        with capture_stderr() as lines:
            try:
                pipe.feed_input("encoded", [data])
                pipe.run()
                error = None
            except RuntimeError as e:
                error, pipe = describe_dali_error(e), None
        if error or lines:
            code, text = ("decode-failed", f"cannot be decoded by DALI ({error})") if error else \
                ("decoder-warning", "makes DALI's video decoder warn: " + "; ".join(dict.fromkeys(lines)))
            problems.append(Problem(sample_id(path, root), path, code, f"{path} {text}; re-encode it or remove it",
                                    depth="full"))
        settings.tick(0)
    return problems


def _resolve_target(t: Target, *, exclude=None):
    if t.kind == "detection":
        return resolve_detection_source(t.folder, t.split, validate=False, exclude=exclude)
    if t.kind == "video":
        return resolve_video_source(t.folder, t.split, exclude=exclude)
    if t.folder.is_file():
        return read_file_list(t.folder, validate=False, exclude=exclude, require_files=False)
    return resolve_source(t.folder, t.split, validate=False, exclude=exclude)


def _count(source) -> int:
    return getattr(source, "num_images_total", None) or source.num_samples


def check_data(data: str | os.PathLike, *, depth: str = "fast", device: str = "auto", max_pixels: int | None = None,
               splits: Iterable[str] | None = None, threads: int | None = None, batch_size: int | None = None,
               cache_dir: str | None = None, use_cache: bool = True, progress: bool = False,
               transform=None, processes: int | None = None) -> Report:
    """Check every split and format found under ``data`` (see ``discover``); returns the ``Report``.
    ``processes``: header-inspecting processes for image files (``None``: ``CheckSettings``' default);
    ``threads``, ``batch_size``: ``None`` for ``default_threads()``, ``default_batch_size(device)``."""
    device = resolve_device(device)
    threads = default_threads() if threads is None else threads
    batch_size = default_batch_size(device) if batch_size is None else batch_size
    settings = CheckSettings(depth=depth, device=device, threads=threads, batch_size=batch_size, cache_dir=cache_dir,
                             use_cache=use_cache, processes=processes,
                             **({"max_pixels": max_pixels} if max_pixels else {}))
    if is_object_url(data):
        return _check_object_store(str(data), settings=settings, splits=splits, depth=depth, progress=progress)
    targets = [t for t in discover(data) if splits is None or t.split in set(splits)]
    if not targets:
        raise DataError(f"found no dataset under {data}: expected an ImageFolder (train/<class>/...), TFRecord or "
                        "RecordIO files with .idx, file lists (train.txt), a COCO folder (annotations/instances_*.json) "
                        "or a video folder")
    report = Report(str(data), depth, device, settings.max_pixels)
    resolved = []
    for t in targets:
        try:
            resolved.append((t, _resolve_target(t)))
        except DataError as e:  # a layout problem: nothing of the split can be read
            report.splits.append(SplitReport(t.kind, "?", t.split, str(t.folder), 0, [
                Problem(sample_id(t.folder, data), str(t.folder), "layout", str(e))]))
    total = sum(_count(s) for _, s in resolved)
    bar = _progress_bar(total, f"check {depth}", enabled=progress)
    settings = replace(settings, progress=bar.update if bar else None)
    try:
        for t, source in resolved:
            report.splits.append(check_source(source, settings=settings, root=data, split=t.split, transform=transform))
    finally:
        _close_bar(bar)
    return report


def _check_object_store(url: str, *, settings: CheckSettings, splits: Iterable[str] | None, depth: str,
                        progress: bool) -> Report:
    """``check_data`` for an ``s3://`` dataset: the fast pass over the objects' bytes
    (``crossdali.common.data.object_store.check_object_source``)."""
    report = Report(url, depth, settings.device, settings.max_pixels)
    found = find_object_splits(url, SPLITS if splits is None else tuple(splits))
    if not found:
        raise DataError(f"found no dataset under {url}: expected an ImageFolder (train/<class>/...), TFRecord, RecordIO or "
                        "WebDataset files with .idx, or file lists (train.txt)")
    for where, split in found:
        start = time.perf_counter()
        try:
            source = resolve_object_source(where, split, validate=False)
        except DataError as e:
            report.splits.append(SplitReport("classification", "?", split, where, 0, [Problem(split, where, "layout", str(e))]))
            continue
        bar = _progress_bar(source.num_samples, f"check {depth}", enabled=progress)
        try:
            problems, total = check_object_source(source, settings=replace(settings, progress=bar.update if bar else None))
        finally:
            _close_bar(bar)
        location = ", ".join(source.paths) if source.paths else str(source.root)
        report.splits.append(SplitReport("classification", source.format, split, location, total, problems,
                                         time.perf_counter() - start))
    return report


def _progress_bar(total: int, desc: str, *, enabled: bool):
    """A tqdm bar on its own copy of the terminal's descriptor: the full pass captures descriptor 2
    while DALI decodes (what its decoder prints there counts as a warning), and a bar drawn there
    would be taken for one. ``_close_bar`` closes both."""
    if not enabled:
        return None
    from tqdm import tqdm  # defer: only the command line draws a bar

    try:
        stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # no descriptor (a test's capture)
        stream = None
    bar = tqdm(total=total, desc=desc, unit="sample", dynamic_ncols=True, file=stream or sys.stderr)
    bar.own_stream = stream
    return bar


def _close_bar(bar) -> None:
    if bar is None:
        return
    bar.close()
    if bar.own_stream is not None:
        bar.own_stream.close()


def check_before_training(sources: Sequence, *, depth: str = "fast", device: str = "auto",
                          max_pixels: int | None = None, cache_dir: str | None = None, progress: bool = False,
                          data_hint: str | None = None) -> list[SplitReport]:
    """What a training script calls before it builds anything: check the resolved ``sources``
    (exclusions already applied by ``resolve_*(..., exclude=)``), log what was found, and raise
    one ``DataError`` listing every bad sample with the fix and the exclusion route. Cached by
    path, size and mtime, so a second start costs a ``stat`` per file (``--skip-check`` skips it)."""
    device = resolve_device(device)
    settings = CheckSettings(depth=depth, device=device, cache_dir=cache_dir,
                             **({"max_pixels": max_pixels} if max_pixels else {}))
    start = time.perf_counter()
    bar = _progress_bar(sum(_count(s) for s in sources), f"check {depth}", enabled=progress)
    settings = replace(settings, progress=bar.update if bar else None)
    reports = []
    try:
        for source in sources:
            root = getattr(source, "root", None)
            reports.append(check_source(source, settings=settings, root=root, split=getattr(source, "split", "")))
    finally:
        _close_bar(bar)
    problems = [p for r in reports for p in r.problems]
    for p in problems:
        if p.severity == "warning":
            log.warning("%s", p.message)
    n = sum(r.num_samples for r in reports)
    log.info("data check (%s, %s): %d samples in %.1f s, %d bad", depth, device, n, time.perf_counter() - start,
             sum(len(r.errors) for r in reports))
    error = problems_error(problems, where=", ".join(r.location for r in reports), total=n,
                           data_hint=data_hint or (str(getattr(sources[0], "root", "")) if sources else None))
    if error is not None:
        raise error
    return reports
