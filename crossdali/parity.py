"""Cross-framework parity: every framework's wrapper must hand the model the very same numbers.

    python -m crossdali.parity dump --framework pytorch --out .cache/parity      # in the torch env
    python -m crossdali.parity dump --framework tensorflow --out .cache/parity   # in the TF env
    python -m crossdali.parity compare .cache/parity                             # anywhere with numpy

``dump`` runs the shared train pipeline (fixed seed) and val pipeline in CPU mode (``dali-cpu``)
(and, where the framework has a video wrapper, the clip pipeline's train and val: ``VIDEO_SPLITS``)
through THAT framework's wrapper, converts the first K batches to numpy in one layout (NCHW) and
writes ``<out>/<framework>.npz``. ``compare`` checks that all dumps present are identical bit for
bit and fails loudly with the first differing framework pair, split, batch, sample index and the
max abs difference; with fewer than ``--min-frameworks`` dumps it fails too (nothing was proven).

Only CPU mode is compared: on a GPU the mixed decoder (nvJPEG / the hardware JPEG decoder) may
differ from the CPU decoder by a few grey levels, so GPU runs are equal across frameworks (same
DALI ops, same seed) but not necessarily equal to the CPU dumps. See docs/parity.md.

Adding a framework: write ``_dump_<name>(cfg) -> {split: [(images NCHW float32, labels (N,) int64), ...]}``
importing the framework inside the function, and register it in ``DUMPERS``. This module imports
only numpy at top level, so ``compare`` runs in a light environment.
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

__all__ = ["DumpConfig", "DUMPERS", "ParityError", "dump", "compare", "load_dump", "mark_session_started"]

SPLITS = ("train", "val")
#: Video clip batches (``crossdali.common.video``, NCFHW), dumped by the frameworks that have a video
#: wrapper when ``DumpConfig.video_data`` is set; compared among the dumps that hold them.
VIDEO_SPLITS = ("video_train", "video_val")
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


Batches = list[tuple[np.ndarray, np.ndarray]]


def _take(loader: Iterable, count: int, to_numpy: Callable, *, channels_last: bool) -> Batches:
    out: Batches = []
    for images, labels in loader:
        x = np.asarray(to_numpy(images))
        if channels_last:
            x = x.transpose(0, 3, 1, 2)
        out.append((np.ascontiguousarray(x), np.asarray(to_numpy(labels)).reshape(-1).astype(np.int64)))
        if len(out) == count:
            break
    if len(out) < count:
        raise ValueError(f"the loader gave {len(out)} batches, fewer than --batches {count}: use a bigger data set")
    return out


def _dump_pytorch(cfg: DumpConfig) -> dict[str, Batches]:
    from crossdali.pytorch import create_classification_loader  # defer: torch

    result = {}
    for split in SPLITS:
        loader = create_classification_loader(cfg.data, train=split == "train", backend="dali-cpu",
                                              batch_size=cfg.batch_size, crop_size=cfg.crop_size,
                                              workers=cfg.workers, seed=cfg.seed)
        result[split] = _take(loader, cfg.batches, lambda t: t.cpu().numpy(), channels_last=False)
    if cfg.video_data:
        from crossdali.pytorch import create_video_loader

        for split in VIDEO_SPLITS:
            loader = create_video_loader(cfg.video_data, train=split == "video_train", **_video_kwargs(cfg))
            result[split] = _take(loader, cfg.batches, lambda t: t.cpu().numpy(), channels_last=False)
    return result


def _dump_tensorflow(cfg: DumpConfig) -> dict[str, Batches]:
    from crossdali.tensorflow import create_classification_loader  # defer: tensorflow

    result = {}
    for split in SPLITS:
        loader = create_classification_loader(cfg.data, train=split == "train", backend="dali-cpu",
                                              batch_size=cfg.batch_size, crop_size=cfg.crop_size,
                                              workers=cfg.workers, seed=cfg.seed, layout="HWC")
        result[split] = _take(loader, cfg.batches, lambda t: t.numpy(), channels_last=True)
    if cfg.video_data:
        from crossdali.tensorflow import create_video_loader

        for split in VIDEO_SPLITS:
            loader = create_video_loader(cfg.video_data, train=split == "video_train", **_video_kwargs(cfg))
            result[split] = _take(loader, cfg.batches, lambda t: t.numpy(), channels_last=False)
    return result


def _dump_mxnet(cfg: DumpConfig) -> dict[str, Batches]:
    from crossdali.mxnet import create_classification_loader  # defer: mxnet (its own env: numpy 1.23)

    result = {}
    for split in SPLITS:
        it = create_classification_loader(cfg.data, train=split == "train", backend="dali-cpu",
                                          batch_size=cfg.batch_size, crop_size=cfg.crop_size,
                                          workers=cfg.workers, seed=cfg.seed)
        n = cfg.batch_size
        rows = ((b.data[0][: n - b.pad], b.label[0][: n - b.pad]) for b in it)  # MXNet's padded last batch
        result[split] = _take(rows, cfg.batches, lambda a: a.asnumpy(), channels_last=False)
    return result


def _dump_jax(cfg: DumpConfig) -> dict[str, Batches]:
    from crossdali.jax import create_classification_loader  # defer: jax

    result = {}
    for split in SPLITS:
        loader = create_classification_loader(cfg.data, train=split == "train", backend="dali-cpu",
                                              batch_size=cfg.batch_size, crop_size=cfg.crop_size,
                                              workers=cfg.workers, seed=cfg.seed, layout="HWC")
        result[split] = _take(loader, cfg.batches, np.asarray, channels_last=True)
    if cfg.video_data:
        from crossdali.jax import create_video_loader

        for split in VIDEO_SPLITS:
            loader = create_video_loader(cfg.video_data, train=split == "video_train", **_video_kwargs(cfg))
            result[split] = _take(loader, cfg.batches, np.asarray, channels_last=False)
    return result


def _video_kwargs(cfg: DumpConfig) -> dict:
    """The clip pipeline settings every framework dumps with (NCFHW, CPU mode)."""
    import importlib.util

    return {"backend": "dali-cpu", "batch_size": cfg.batch_size, "sequence_length": 8, "stride": 2,
            "crop_size": cfg.crop_size, "workers": cfg.workers, "seed": cfg.seed, "layout": "NCFHW",
            "validate": importlib.util.find_spec("av") is not None}  # probing the files needs PyAV


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
        for i, (images, labels) in enumerate(items):
            arrays[f"{split}/{i}/images"] = images
            arrays[f"{split}/{i}/labels"] = labels
    meta = {"framework": framework, "config": asdict(cfg), "layout": LAYOUT, "data_digest": _data_digest(Path(cfg.data)),
            "video_digest": _data_digest(Path(cfg.video_data)) if cfg.video_data else "",
            "versions": _versions(framework), "time": time.time()}
    tmp = out_dir / f".{framework}.partial.npz"
    np.savez(tmp, __meta__=np.array(json.dumps(meta)), **arrays)
    tmp.rename(path)
    return path


def load_dump(path: Path) -> tuple[dict, dict[str, Batches]]:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["__meta__"]))
        batches: dict[str, Batches] = {}
        for split in SPLITS + VIDEO_SPLITS:
            i = 0
            while f"{split}/{i}/images" in z:
                batches.setdefault(split, []).append((z[f"{split}/{i}/images"], z[f"{split}/{i}/labels"]))
                i += 1
    return meta, batches


def _first_difference(a: Batches, b: Batches) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} batches"
    for i, ((xa, ya), (xb, yb)) in enumerate(zip(a, b)):
        if xa.shape != xb.shape or xa.dtype != xb.dtype:
            return f"batch {i}: images {xa.shape} {xa.dtype} vs {xb.shape} {xb.dtype}"
        if not np.array_equal(ya, yb):
            j = int(np.flatnonzero(ya != yb)[0]) if ya.shape == yb.shape else 0
            return f"batch {i} sample {j}: labels {ya.tolist()} vs {yb.tolist()}"
        same = xa.view(np.uint8).reshape(xa.shape[0], -1) == xb.view(np.uint8).reshape(xb.shape[0], -1)
        if not same.all():
            j = int(np.flatnonzero(~same.all(axis=1))[0])
            diff = np.abs(xa[j].astype(np.float64) - xb[j].astype(np.float64))
            return (f"batch {i} sample {j} (label {int(ya[j])}): max abs diff {float(diff.max()):.6g}, "
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
        for key in ("config", "layout", "data_digest", "video_digest"):
            if meta.get(key) != ref_meta.get(key):
                raise ParityError(f"{ref_name} and {name} dumps were made with different {key}: "
                                  f"{ref_meta.get(key)} vs {meta.get(key)}; dump both again with the same options")
        for split in SPLITS:
            if split not in ref or split not in batches:
                raise ParityError(f"{ref_name if split not in ref else name} dump has no {split} batches")
            problem = _first_difference(ref[split], batches[split])
            if problem:
                raise ParityError(f"{ref_name} vs {name}, {split}: {problem}")
    for split in VIDEO_SPLITS:  # only frameworks with a video wrapper dump these
        holders = [(name, batches) for name, _, batches in dumps if split in batches]
        if len(holders) == 1:
            raise ParityError(f"only the {holders[0][0]} dump has {split} batches, nothing to compare them with: "
                              "dump another framework with the same video data")
        for name, batches in holders[1:]:
            problem = _first_difference(holders[0][1][split], batches[split])
            if problem:
                raise ParityError(f"{holders[0][0]} vs {name}, {split}: {problem}")
    return [d[0] for d in dumps]


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
    return parser


def main(args: argparse.Namespace) -> None:
    if args.command == "dump":
        data = args.data
        if data is None:
            from crossdali.common.sample_data import ensure_classification  # defer: PIL

            data = ensure_classification(size="tiny") / "imagefolder"
        video = args.video_data
        if video is None:
            try:
                from crossdali.common.sample_data.video import ensure_video  # defer: PyAV

                video = ensure_video(size="tiny")
            except ImportError as e:
                print(f"parity: no video clips in this dump ({e})", file=sys.stderr)
        cfg = DumpConfig(data=str(Path(data).resolve()), batches=args.batches, batch_size=args.batch_size,
                         crop_size=args.crop_size, workers=args.workers, seed=args.seed,
                         video_data=str(Path(video).resolve()) if video else "")
        path = dump(args.framework, args.out, cfg)
        print(f"parity: wrote {path}")
        return
    if args.command == "mark":
        mark_session_started(args.out, args.framework, args.session)
        return
    try:
        names = compare(args.out, min_frameworks=args.min_frameworks, expect=[x for x in args.expect.split(",") if x])
    except ParityError as e:
        print(f"parity FAILED: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    video = [n for n in names if set(VIDEO_SPLITS) <= set(load_dump(Path(args.out) / f"{n}.npz")[1])]
    clips = f"; video clips (NCFHW): {', '.join(video)}" if video else ""
    print(f"parity: {', '.join(names)} identical bit for bit (train and val, CPU mode, layout {LAYOUT}{clips})")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
