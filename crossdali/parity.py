"""Cross-framework parity: every framework's wrapper must hand the model the very same numbers.

    python -m crossdali.parity dump --framework pytorch --out .cache/parity      # in the torch env
    python -m crossdali.parity dump --framework tensorflow --out .cache/parity   # in the TF env
    python -m crossdali.parity compare .cache/parity                             # anywhere with numpy
    python -m crossdali.parity gpu --out /tmp/parity_gpu                          # GPU machine, all frameworks there

``dump`` runs the shared train pipeline (fixed seed), the train pipeline with an augmentation policy
(``--auto-augment``, default ``trivialaugment``: the seed must fix its random choices in every framework)
and the val pipeline (``dali-cpu`` by default,
``--backend dali-gpu`` on a GPU) through THAT framework's wrapper, and, where the framework wraps
them, the clip pipeline (``VIDEO_SPLITS``) and the SSD pipeline (``DETECTION_SPLITS``, with
``--detection-data``); converts the first K batches to numpy in one layout (NCHW, integers as
int64) and writes ``<out>/<framework>.npz``. ``compare`` checks that all dumps present are
identical bit for bit and fails loudly with the first differing framework pair, split, batch,
field, sample index and the max abs difference; with fewer than ``--min-frameworks`` dumps it
fails too (nothing was proven).

``gpu`` is the GPU harness: for the hardware JPEG decoder on and off it dumps every framework
importable here with ``dali-gpu`` (each in its own process), compares them bit for bit, and
measures how far the GPU batches are from the CPU pipeline's (the mixed decoder is not bit-exact
to the CPU decoder); it writes ``summary.json``. See docs/parity.md.

Adding a framework: write ``_dump_<name>(cfg) -> {split: [batch, ...]}`` (a batch is the tuple of
``SPLIT_FIELDS[split]`` arrays) importing the framework inside the function, and register it in
``DUMPERS``. This module imports only numpy at top level, so ``compare`` runs in a light environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

__all__ = ["DumpConfig", "DUMPERS", "ParityError", "dump", "compare", "load_dump", "mark_session_started", "gpu_parity"]

#: Classification: the first batches of the train pipeline's first and second epochs (DALI reshuffles
#: every epoch: the second must agree too), of the train pipeline with ``DumpConfig.auto_augment``'s
#: policy (first epoch) and of val.
SPLITS = ("train", "train_epoch2", "train_auto_augment", "val")
#: Video clip batches (``crossdali.common.video``, NCFHW), dumped by the frameworks that have a video
#: wrapper when ``DumpConfig.video_data`` is set; compared among the dumps that hold them.
VIDEO_SPLITS = ("video_train", "video_val")
#: SSD batches, dumped by the frameworks with a detection wrapper when ``DumpConfig.detection_data`` is set.
DETECTION_SPLITS = ("detection_train", "detection_val")
#: The arrays of one batch, per split, in the order the loaders yield them.
SPLIT_FIELDS = {
    "train": ("images", "labels"), "train_epoch2": ("images", "labels"), "val": ("images", "labels"),
    "train_auto_augment": ("images", "labels"),
    "video_train": ("images", "labels"), "video_val": ("images", "labels"),
    "detection_train": ("images", "offsets", "labels"),
    "detection_val": ("images", "boxes", "labels", "image_ids"),
}
LAYOUT = "NCHW"


class ParityError(AssertionError):
    """Two frameworks' batches differ (or there is not enough to compare)."""


@dataclass(frozen=True)
class DumpConfig:
    """What every framework runs; ``compare`` refuses dumps made with different configs."""

    data: str
    batches: int = 3
    batch_size: int = 8
    crop_size: int = 64
    workers: int = 2
    seed: int = 7
    video_data: str = ""  # the video sample set ("" = no video clips in the dump)
    detection_data: str = ""  # the COCO-format sample set ("" = no SSD batches in the dump)
    backend: str = "dali-cpu"
    hw_decoder_load: float = 1.0
    # the policy of the train_auto_augment split (crossdali.common.augment): TrivialAugment's one operation
    # per image covers most of its 14 operations in a few batches, at the cost of one more pipeline build
    auto_augment: str = "trivialaugment"


Batches = list[tuple[np.ndarray, ...]]


def _field(name: str, array: np.ndarray) -> np.ndarray:
    """One layout for every framework: integers (and MXNet's float32 labels) as int64, label/id vectors as (N,)."""
    array = np.ascontiguousarray(array)
    if array.dtype.kind in "iu" or name in ("labels", "image_ids"):
        array = array.astype(np.int64)
    if name in ("labels", "image_ids") and array.ndim == 2 and array.shape[1] == 1:
        array = array.reshape(-1)
    return array


def _take(loader: Iterable, count: int, to_numpy: Callable, *, channels_last: bool, split: str = "train") -> Batches:
    fields = SPLIT_FIELDS[split]
    out: Batches = []
    for batch in loader:
        arrays = [np.asarray(to_numpy(t)) for t in batch]
        if len(arrays) != len(fields):
            raise ValueError(f"{split}: the loader gave {len(arrays)} arrays per batch, expected {fields}")
        if channels_last:
            arrays[0] = arrays[0].transpose(0, 3, 1, 2)
        out.append(tuple(_field(name, a) for name, a in zip(fields, arrays)))
        if len(out) == count:
            break
    if len(out) < count:
        raise ValueError(f"the loader gave {len(out)} batches, fewer than --batches {count}: use a bigger data set")
    return out


def _two_epochs(loader: Iterable, count: int, to_numpy: Callable) -> tuple[list, list]:
    """The first ``count`` batches of two consecutive epochs, as numpy copies taken at once (a
    framework iterator may reuse its buffers); each epoch is iterated to its end: one ``for`` is one
    epoch for every crossdali loader."""
    def first_batches():
        return [tuple(np.array(to_numpy(t)) for t in batch) for i, batch in enumerate(loader) if i < count]

    return first_batches(), first_batches()


def _classification_kwargs(cfg: DumpConfig) -> dict:
    return {"backend": cfg.backend, "batch_size": cfg.batch_size, "crop_size": cfg.crop_size, "workers": cfg.workers,
            "seed": cfg.seed, "hw_decoder_load": cfg.hw_decoder_load}


def _one_pipeline(factory: Callable) -> dict:
    """``pipelines=1`` where ``factory`` takes it. Several pipelines (the PyTorch and JAX GPU default for video and
    SSD training) each read their own part of the shard into a batch, with their own seed, and TensorFlow's loader
    (``DALIDataset``) has one, so the frameworks are compared on the setting they all have."""
    import inspect

    return {"pipelines": 1} if "pipelines" in inspect.signature(factory).parameters else {}


def _detection_kwargs(cfg: DumpConfig, factory: Callable) -> dict:
    return {"backend": cfg.backend, "batch_size": cfg.batch_size, "workers": cfg.workers, "seed": cfg.seed,
            "hw_decoder_load": cfg.hw_decoder_load, **_one_pipeline(factory)}


def _dump_wrapper(cfg: DumpConfig, module, to_numpy: Callable, *, classification_layout: dict,
                  channels_last: bool) -> dict[str, Batches]:
    """Classification, and video / detection where ``module`` has their factories."""
    result = {}
    for train in (True, False):
        loader = module.create_classification_loader(cfg.data, train=train, **_classification_kwargs(cfg),
                                                     **classification_layout)
        if train:
            first, second = _two_epochs(loader, cfg.batches, to_numpy)
            result["train"] = _take(first, cfg.batches, np.asarray, channels_last=channels_last, split="train")
            result["train_epoch2"] = _take(second, cfg.batches, np.asarray, channels_last=channels_last, split="train")
        else:
            result["val"] = _take(loader, cfg.batches, to_numpy, channels_last=channels_last, split="val")
    loader = module.create_classification_loader(cfg.data, train=True, auto_augment=cfg.auto_augment,
                                                 **_classification_kwargs(cfg), **classification_layout)
    result["train_auto_augment"] = _take(loader, cfg.batches, to_numpy, channels_last=channels_last,
                                         split="train_auto_augment")
    if cfg.video_data and hasattr(module, "create_video_loader"):
        for split in VIDEO_SPLITS:
            loader = module.create_video_loader(cfg.video_data, train=split == "video_train",
                                                **_video_kwargs(cfg, module.create_video_loader))
            result[split] = _take(loader, cfg.batches, to_numpy, channels_last=False, split=split)
    if cfg.detection_data and hasattr(module, "create_detection_loader"):
        for split in DETECTION_SPLITS:
            loader = module.create_detection_loader(cfg.detection_data, train=split == "detection_train",
                                                    **_detection_kwargs(cfg, module.create_detection_loader))
            result[split] = _take(loader, cfg.batches, to_numpy, channels_last=False, split=split)
    return result


def _dump_pytorch(cfg: DumpConfig) -> dict[str, Batches]:
    import crossdali.pytorch as wrapper  # defer: torch

    return _dump_wrapper(cfg, wrapper, lambda t: t.cpu().numpy(), classification_layout={}, channels_last=False)


def _dump_tensorflow(cfg: DumpConfig) -> dict[str, Batches]:
    import crossdali.tensorflow as wrapper  # defer: tensorflow

    return _dump_wrapper(cfg, wrapper, lambda t: t.numpy(), classification_layout={"layout": "HWC"}, channels_last=True)


def _dump_jax(cfg: DumpConfig) -> dict[str, Batches]:
    import crossdali.jax as wrapper  # defer: jax

    return _dump_wrapper(cfg, wrapper, np.asarray, classification_layout={"layout": "HWC"}, channels_last=True)


def _dump_mxnet(cfg: DumpConfig) -> dict[str, Batches]:
    from crossdali.mxnet import create_classification_loader  # defer: mxnet (its own env: numpy 1.23)

    result, n = {}, cfg.batch_size

    def rows(it):  # MXNet's padded last batch, cut; copied at once
        return [(b.data[0][: n - b.pad].asnumpy(), b.label[0][: n - b.pad].asnumpy()) for b in it]

    train = create_classification_loader(cfg.data, train=True, **_classification_kwargs(cfg))
    first, second = rows(train), rows(train)  # one `for` per epoch, as every crossdali loader
    result["train"] = _take(first, cfg.batches, np.asarray, channels_last=False, split="train")
    result["train_epoch2"] = _take(second, cfg.batches, np.asarray, channels_last=False, split="train")
    augmented = create_classification_loader(cfg.data, train=True, auto_augment=cfg.auto_augment,
                                             **_classification_kwargs(cfg))
    result["train_auto_augment"] = _take(rows(augmented), cfg.batches, np.asarray, channels_last=False,
                                         split="train_auto_augment")
    val = create_classification_loader(cfg.data, train=False, **_classification_kwargs(cfg))
    result["val"] = _take(rows(val), cfg.batches, np.asarray, channels_last=False, split="val")
    return result


def _video_kwargs(cfg: DumpConfig, factory: Callable) -> dict:
    """The clip pipeline settings every framework dumps with (NCFHW), one DALI pipeline per process
    (``_one_pipeline``)."""
    import importlib.util

    return {"backend": cfg.backend, "batch_size": cfg.batch_size, "sequence_length": 8, "stride": 2,
            "crop_size": cfg.crop_size, "workers": cfg.workers, "seed": cfg.seed, "layout": "NCFHW",
            "validate": importlib.util.find_spec("av") is not None,  # probing the files needs PyAV
            **_one_pipeline(factory)}


#: framework name -> dump function (imports its framework lazily).
DUMPERS: dict[str, Callable[[DumpConfig], dict[str, Batches]]] = {
    "pytorch": _dump_pytorch,
    "tensorflow": _dump_tensorflow,
    "mxnet": _dump_mxnet,
    "jax": _dump_jax,
}


def _data_digest(data: Path) -> str:
    """Digest of the files the pipelines read (names and sizes), so dumps of different data never
    get compared."""
    h = hashlib.sha256()
    for p in sorted(Path(data).rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(data)}:{p.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def _versions(framework: str) -> dict[str, str]:
    from importlib import metadata

    names = {"pytorch": "torch", "tensorflow": "tensorflow-cpu", "mxnet": "mxnet"}
    out = {}
    for name in ("nvidia-dali-cuda130", names.get(framework, framework), "tensorflow"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def dump(framework: str, out_dir: Path, cfg: DumpConfig) -> Path:
    """Run ``framework``'s wrapper and write ``out_dir/<framework>.npz``; return its path.

    The previous dump of that framework is deleted first, so a failed run never leaves a stale
    file behind for ``compare`` to pass on.
    """
    if framework not in DUMPERS:
        raise ValueError(f"unknown framework {framework!r}; registered: {sorted(DUMPERS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{framework}.npz"
    path.unlink(missing_ok=True)
    batches = DUMPERS[framework](cfg)
    arrays = {}
    for split, items in batches.items():
        for i, batch in enumerate(items):
            for name, array in zip(SPLIT_FIELDS[split], batch):
                arrays[f"{split}/{i}/{name}"] = array
    meta = {"framework": framework, "config": asdict(cfg), "layout": LAYOUT, "data_digest": _data_digest(Path(cfg.data)),
            "video_digest": _data_digest(Path(cfg.video_data)) if cfg.video_data else "",
            "detection_digest": _data_digest(Path(cfg.detection_data)) if cfg.detection_data else "",
            "versions": _versions(framework), "time": time.time()}
    tmp = out_dir / f".{framework}.partial.npz"
    np.savez(tmp, __meta__=np.array(json.dumps(meta)), **arrays)
    tmp.rename(path)
    return path


def load_dump(path: Path) -> tuple[dict, dict[str, Batches]]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        batches: dict[str, Batches] = {}
        for split, fields in SPLIT_FIELDS.items():
            i = 0
            while f"{split}/{i}/{fields[0]}" in z:
                batches.setdefault(split, []).append(tuple(z[f"{split}/{i}/{name}"] for name in fields))
                i += 1
    return meta, batches


def _first_difference(a: Batches, b: Batches, *, split: str = "train") -> str | None:
    """Where two frameworks' batches first differ (shape, dtype or a single bit), or ``None``."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} batches"
    fields = SPLIT_FIELDS[split]
    for i, (ba, bb) in enumerate(zip(a, b)):
        labels_a = ba[fields.index("labels")]
        for name, xa, xb in zip(fields, ba, bb):
            if xa.shape != xb.shape or xa.dtype != xb.dtype:
                return f"batch {i}: {name} {xa.shape} {xa.dtype} vs {xb.shape} {xb.dtype}"
            same = xa.view(np.uint8).reshape(xa.shape[0], -1) == xb.view(np.uint8).reshape(xb.shape[0], -1)
            if same.all():
                continue
            j = int(np.flatnonzero(~same.all(axis=1))[0])
            if name in ("labels", "image_ids") and xa.ndim == 1:
                return f"batch {i} sample {j}: {name} {xa.tolist()} vs {xb.tolist()}"
            diff = np.abs(xa[j].astype(np.float64) - xb[j].astype(np.float64))
            label = f" (label {int(labels_a[j])})" if labels_a.ndim == 1 else ""
            return (f"batch {i} sample {j}{label}: {name} max abs diff {float(diff.max()):.6g}, "
                    f"{int(np.count_nonzero(diff))} of {diff.size} values differ")
    return None


def mark_session_started(out_dir: Path, framework: str, session: str) -> None:
    """Note that ``session`` (a nox session) is about to produce ``framework``'s dump, and delete the
    old dump: if the session fails before dumping, ``compare`` names it instead of comparing stale or
    partial data (or failing on a follow-on error)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{framework}.npz").unlink(missing_ok=True)
    (out_dir / f"{framework}.status").write_text(
        f"the {session} session started at {time.strftime('%H:%M:%S')} but never wrote its parity dump: it failed "
        f"before its last step (its own output above says where); fix that and run `nox -s {session} parity`\n")


def _missing(out_dir: Path, expect: Iterable[str], present: set[str]) -> str | None:
    """Why expected frameworks have no dump, from the markers their sessions left (or their absence)."""
    reasons = []
    for name in expect:
        if name in present:
            continue
        status = Path(out_dir) / f"{name}.status"
        reasons.append(f"{name}: " + (status.read_text().strip() if status.is_file() else
                                      f"no {name} dump and no session started one (run `nox -s tests-{name}`)"))
    return "; ".join(reasons) or None


def compare(out_dir: Path, *, min_frameworks: int = 2, expect: Iterable[str] = ()) -> list[str]:
    """Compare every ``<framework>.npz`` in ``out_dir`` with the first; raise ``ParityError`` on the
    first difference. Returns the frameworks compared. Every framework in ``expect`` must have
    dumped: a missing one is reported first, with the reason its session left behind."""
    paths = sorted(Path(out_dir).glob("*.npz"))
    paths = [p for p in paths if not p.name.startswith(".")]
    missing = _missing(out_dir, expect, {p.stem for p in paths})
    if missing:
        raise ParityError(f"missing framework dump(s), nothing was compared. {missing}")
    if len(paths) < min_frameworks:
        raise ParityError(f"{len(paths)} framework dump(s) in {out_dir} ({', '.join(p.stem for p in paths) or 'none'}); "
                          f"need at least {min_frameworks}: run `python -m crossdali.parity dump --framework NAME "
                          f"--out {out_dir}` in each framework's environment (nox does it in tests-<framework>)")
    dumps = [(p.stem, *load_dump(p)) for p in paths]
    ref_name, ref_meta, ref = dumps[0]
    for name, meta, batches in dumps[1:]:
        for key in ("config", "layout", "data_digest", "video_digest", "detection_digest"):
            if meta.get(key) != ref_meta.get(key):
                raise ParityError(f"{ref_name} and {name} dumps were made with different {key}: "
                                  f"{ref_meta.get(key)} vs {meta.get(key)}; dump both again with the same options")
        for split in SPLITS:
            if split not in ref or split not in batches:
                raise ParityError(f"{ref_name if split not in ref else name} dump has no {split} batches")
            problem = _first_difference(ref[split], batches[split], split=split)
            if problem:
                raise ParityError(f"{ref_name} vs {name}, {split}: {problem}")
    for split in VIDEO_SPLITS + DETECTION_SPLITS:  # only frameworks with such a wrapper dump these
        holders = [(name, batches) for name, _, batches in dumps if split in batches]
        if len(holders) == 1:
            raise ParityError(f"only the {holders[0][0]} dump has {split} batches, nothing to compare them with: "
                              "dump another framework with the same data")
        for name, batches in holders[1:]:
            problem = _first_difference(holders[0][1][split], batches[split], split=split)
            if problem:
                raise ParityError(f"{holders[0][0]} vs {name}, {split}: {problem}")
    return [d[0] for d in dumps]


def split_report(out_dir: Path) -> dict[str, str]:
    """Every split's verdict over the dumps in ``out_dir``, where ``compare`` stops at the first difference: the
    frameworks found identical (``"identical: jax, pytorch"``) or each one that differs from the first framework
    holding the split, with where. The GPU harness records it so that one run on a GPU machine tells every split."""
    dumps = [(p.stem, load_dump(p)[1]) for p in sorted(Path(out_dir).glob("*.npz")) if not p.name.startswith(".")]
    report = {}
    for split in SPLITS + VIDEO_SPLITS + DETECTION_SPLITS:
        holders = [(name, batches[split]) for name, batches in dumps if split in batches]
        if len(holders) < 2:
            report[split] = f"not compared: dumped by {holders[0][0] if holders else 'none'}"
            continue
        (first, ref), problems = holders[0], []
        for name, batches in holders[1:]:
            if problem := _first_difference(ref, batches, split=split):
                problems.append(f"{first} vs {name}: {problem}")
        report[split] = "; ".join(problems) or "identical: " + ", ".join(name for name, _ in holders)
    return report


def dumped_splits(out_dir: Path, name: str) -> list[str]:
    return [split for split in SPLIT_FIELDS if split in load_dump(Path(out_dir) / f"{name}.npz")[1]]


def _first_images_difference(a: Batches, b: Batches, *, split: str) -> dict:
    """Max / mean absolute difference of the images of two dumps of one split (same samples), and
    whether the labels agree."""
    diffs = [np.abs(x[0].astype(np.float64) - y[0].astype(np.float64)) for x, y in zip(a, b)]
    k = SPLIT_FIELDS[split].index("labels")
    return {"max_abs": float(max(d.max() for d in diffs)), "mean_abs": float(np.mean([d.mean() for d in diffs])),
            "labels_equal": all(np.array_equal(x[k], y[k]) for x, y in zip(a, b))}


#: said beside a GPU-vs-CPU video distance whose labels differ (the distance is then not between the same clips)
VIDEO_GPU_VS_CPU_NOTE = ("the GPU and CPU batches hold other clips (labels differ), so the distance is not between "
                         "the same clips")


def gpu_parity(out_dir: Path, *, frameworks: Iterable[str], data: Path, video_data: Path | None,
               detection_data: Path | None, hw_decoder_loads: Iterable[float] = (1.0, 0.0), timeout: float = 300) -> dict:
    """The GPU harness: dump every framework with ``dali-gpu`` (each in its own process, hardware JPEG
    decoder share by share), compare them bit for bit, and measure the distance to the CPU pipeline."""
    import subprocess

    out_dir = Path(out_dir)
    common = ["--data", str(data)]
    if video_data:
        common += ["--video-data", str(video_data)]
    if detection_data:
        common += ["--detection-data", str(detection_data)]
    summary: dict = {"command": " ".join(["python -m crossdali.parity", *sys.argv[1:]]), "configs": [],
                     "frameworks": list(frameworks)}

    def run_dump(framework: str, folder: Path, *extra: str) -> dict:
        cmd = [sys.executable, "-m", "crossdali.parity", "dump", "--framework", framework, "--out", str(folder),
               *common, *extra]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        row = {"framework": framework, "returncode": proc.returncode, "seconds": round(time.perf_counter() - start, 1)}
        if proc.returncode != 0:
            row["error"] = proc.stderr.strip()[-1500:]
        return row

    cpu = run_dump("pytorch", out_dir / "cpu", "--backend", "dali-cpu")
    for load in hw_decoder_loads:
        folder = out_dir / f"gpu-hw{load:g}"
        rows = [run_dump(f, folder, "--backend", "dali-gpu", "--hw-decoder-load", str(load)) for f in frameworks]
        config = {"backend": "dali-gpu", "hw_decoder_load": load, "dumps": rows}
        dumped = [r["framework"] for r in rows if r["returncode"] == 0]
        for row in rows:  # the versions each dump was made with (DALI, the framework), for the record
            if row["returncode"] == 0:
                row["versions"] = load_dump(folder / f"{row['framework']}.npz")[0].get("versions")
        try:
            config["identical"] = compare(folder, min_frameworks=2)
            config["splits"] = dumped_splits(folder, config["identical"][0])
        except ParityError as e:
            config["identical"] = []
            config["difference"] = str(e)
        if len(dumped) >= 2:
            config["split_report"] = split_report(folder)
        if cpu["returncode"] == 0 and "pytorch" in dumped:
            _, gpu_batches = load_dump(folder / "pytorch.npz")
            _, cpu_batches = load_dump(out_dir / "cpu" / "pytorch.npz")
            config["gpu_vs_cpu"] = {split: _first_images_difference(gpu_batches[split], cpu_batches[split], split=split)
                                    for split in gpu_batches if split in cpu_batches}
            for split in config["gpu_vs_cpu"]:
                if split.startswith("video") and not config["gpu_vs_cpu"][split]["labels_equal"]:
                    config["gpu_vs_cpu"][split]["note"] = VIDEO_GPU_VS_CPU_NOTE
        summary["configs"].append(config)
    summary["cpu_reference"] = cpu
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="crossdali cross-framework parity", add_help=add_help)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="run one framework's wrapper and dump its first batches")
    d.add_argument("--framework", required=True, choices=sorted(DUMPERS))
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--data", type=Path, default=None,
                   help="ImageFolder with train/ and val/; default: the tiny sample set (built if missing)")
    d.add_argument("--video-data", type=Path, default=None,
                   help="video set with train.txt/val.txt; default: the tiny video sample set (if PyAV can build it)")
    d.add_argument("--detection-data", type=Path, default=None,
                   help="COCO-format set; default: the tiny detection sample set")
    d.add_argument("--backend", choices=("dali-cpu", "dali-gpu"), default="dali-cpu")
    d.add_argument("--hw-decoder-load", type=float, default=1.0, help="hardware JPEG decoder share (dali-gpu)")
    d.add_argument("--auto-augment", default=DumpConfig.auto_augment,
                   choices=("autoaugment", "randaugment", "trivialaugment"),
                   help="augmentation policy of the train_auto_augment split (crossdali.common.augment)")
    for field in ("batches", "batch_size", "crop_size", "workers", "seed"):
        d.add_argument(f"--{field.replace('_', '-')}", type=int, default=DumpConfig.__dataclass_fields__[field].default)
    c = sub.add_parser("compare", help="compare all dumps in a folder, bit for bit")
    c.add_argument("out", type=Path)
    c.add_argument("--min-frameworks", type=int, default=2)
    c.add_argument("--expect", default="", help="comma-separated frameworks that must have dumped (e.g. pytorch,mxnet)")
    m = sub.add_parser("mark", help="note that a session is about to dump (nox calls this first)")
    m.add_argument("out", type=Path)
    m.add_argument("--framework", required=True, choices=sorted(DUMPERS))
    m.add_argument("--session", required=True)
    g = sub.add_parser("gpu", help="GPU harness: every framework here with dali-gpu, hardware decoder on and off")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--frameworks", default="", help="comma-separated (default: every importable one but mxnet)")
    return parser


def _default_data(kind: str, size: str = "tiny") -> Path | None:
    """A sample set for the dumps (built if missing); ``None`` where its builder's dependency is absent."""
    try:
        if kind == "classification":
            from crossdali.common.data.sample_data import ensure_classification  # defer: PIL

            return ensure_classification(size=size, formats=("imagefolder",)) / "imagefolder"  # all it reads
        if kind == "video":
            from crossdali.common.data.sample_data.video import ensure_video  # defer: PyAV

            return ensure_video(size=size)
        from crossdali.common.data.sample_data import ensure_detection

        return ensure_detection(size=size)
    except ImportError as e:
        print(f"parity: no {kind} batches in this dump ({e})", file=sys.stderr)
        return None


def main(args: argparse.Namespace) -> None:
    if args.command == "dump":
        data = args.data or _default_data("classification")
        video = args.video_data or _default_data("video", "gpu-tiny" if args.backend == "dali-gpu" else "tiny")
        detection = args.detection_data or _default_data("detection")
        cfg = DumpConfig(data=str(Path(data).resolve()), batches=args.batches, batch_size=args.batch_size,
                         crop_size=args.crop_size, workers=args.workers, seed=args.seed,
                         video_data=str(Path(video).resolve()) if video else "",
                         detection_data=str(Path(detection).resolve()) if detection else "",
                         backend=args.backend, hw_decoder_load=args.hw_decoder_load, auto_augment=args.auto_augment)
        path = dump(args.framework, args.out, cfg)
        print(f"parity: wrote {path}")
        return
    if args.command == "mark":
        mark_session_started(args.out, args.framework, args.session)
        return
    if args.command == "gpu":
        import importlib.util

        modules = {"pytorch": "torch", "tensorflow": "tensorflow", "jax": "jax"}
        frameworks = [f for f in args.frameworks.split(",") if f] or \
            [f for f, m in modules.items() if importlib.util.find_spec(m) is not None]
        summary = gpu_parity(args.out, frameworks=frameworks, data=_default_data("classification"),
                             video_data=_default_data("video", "gpu-tiny"), detection_data=_default_data("detection"))
        for config in summary["configs"]:
            same = ", ".join(config["identical"]) or "NOT identical: " + config.get("difference", "dumps failed")
            print(f"dali-gpu hw_decoder_load={config['hw_decoder_load']:g}: {same}")
            if not config["identical"]:
                for split, verdict in config.get("split_report", {}).items():
                    print(f"  {split}: {verdict}")
        print(f"wrote {args.out / 'summary.json'}")
        return
    try:
        names = compare(args.out, min_frameworks=args.min_frameworks, expect=[x for x in args.expect.split(",") if x])
    except ParityError as e:
        print(f"parity FAILED: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    held = {n: dumped_splits(args.out, n) for n in names}
    extra = [f"{kind} ({', '.join(n for n in names if set(splits) <= set(held[n]))})"
             for kind, splits in (("video clips", VIDEO_SPLITS), ("SSD batches", DETECTION_SPLITS))
             if any(set(splits) <= set(held[n]) for n in names)]
    policy = load_dump(args.out / f"{names[0]}.npz")[0]["config"].get("auto_augment", "none")
    print(f"parity: {', '.join(names)} identical bit for bit (classification train, train with {policy} and val, "
          f"layout {LAYOUT}"
          + (f"; {'; '.join(extra)}" if extra else "") + ")")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
