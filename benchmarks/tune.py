"""How close ``crossdali tune`` gets to the best loader settings: the tune (60 s) against an exhaustive sweep of
the same grid in the same call, on the shared classification train pipeline (no framework imported).

    python -m benchmarks.tune                             # on a GPU machine: dali-gpu, batch 256, 224 px (results/latest)
    python -m benchmarks.tune --cpu --smoke               # tiny CPU run: the tuned settings against the defaults

Three phases over the ``bench`` sample set's train split (``--size``), each trial as ``crossdali tune`` measures
one (``crossdali.common.tune.measure``: the pipelines built, a warm-up, then a timed window):

1. tune: ``crossdali.common.tune.tune`` in ``--budget`` seconds (what ``crossdali tune`` runs; no file is written);
2. sweep: every configuration of the same grid (``default_grid``: threads x hardware-decoder share x pipelines x
   prefetch), once each, with a ``--sweep-window`` window; stops at ``--sweep-limit`` seconds (then ``complete``
   is false);
3. rounds: the sweep's ``--top`` fastest configurations, the tuned one and the defaults, measured again in
   ``--rounds`` interleaved rounds with a ``--window`` window (a sweep's single fastest window is the luckiest
   of many, so its best is measured again beside the others). The best is the configuration with the highest
   median over the rounds; ``tuned_share.of_medians`` is the tuned configuration's median over the best's
   (target: at least 0.97; also per round: mean, min, max); ``defaults_share`` the same for the defaults and
   ``tuned_over_defaults`` the tuned configuration against the defaults.

Writes ``tune.json`` and ``tune.png`` (``--cpu`` runs: ``tune_cpu.*``) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks import cpu_model, gpu_name, round_spread, usage_error
from benchmarks.plot import backend_color, bar_png

TARGET_SHARE = 0.97


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample set")
    parser.add_argument("--size", default="bench", help="sample set size (its train split is read)")
    parser.add_argument("--data", type=Path, default=None, help="a dataset folder instead of the sample set")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds for the tune")
    parser.add_argument("--sweep-warmup", type=float, default=0.3, help="seconds of warm-up per sweep trial")
    parser.add_argument("--sweep-window", type=float, default=0.6, help="timed seconds per sweep trial")
    parser.add_argument("--sweep-limit", type=float, default=420.0,
                        help="seconds the sweep may take at most (then the report says it is not complete)")
    parser.add_argument("--top", type=int, default=3, help="the sweep's fastest configurations measured again")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the last phase")
    parser.add_argument("--window", type=float, default=1.5, help="timed seconds per trial of the last phase")
    parser.add_argument("--cpu", action="store_true", help="dali-cpu even where a GPU is visible")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny set, batch 32 at 64 px, 4 s tune, very short windows: checks the script runs")
    return parser


def _key(settings) -> tuple:
    return tuple(asdict(settings).values())


def plot(report: dict, png: Path) -> Path | None:
    rows = sorted(report["rounds"]["configs"], key=lambda r: -r["images_per_s"])
    names, values, labels, colors = [], [], [], []
    for row in rows:
        tags = [t for t, on in (("tuned", row["tuned"]), ("defaults", row["defaults"])) if on]
        names.append(row["label"] + (f"  [{', '.join(tags)}]" if tags else ""))
        values.append(row["images_per_s"])
        labels.append(f"{row['images_per_s']:,.0f}")
        colors.append(backend_color(report["backend"]) if row["tuned"] else "#bbbbbb")
    share = report["tuned_share"]["of_medians"]
    return bar_png(png, names, values, labels=labels, colors=colors, width=11, xlabel="images/s (median of the rounds)",
                   title=f"crossdali tune on {report['gpu'] or report['cpu']}: tuned = {share:.1%} of the best\n"
                         f"of {report['sweep']['configs']} configurations ({report['backend']}, batch "
                         f"{report['batch_size']}, {report['crop_size']} px)")


def main(args: argparse.Namespace) -> dict:
    from crossdali.common.data.sample_data import ensure_classification
    from crossdali.common.data.sources import resolve_source
    from crossdali.common.tune import NOISE_MARGIN, default_grid, default_settings, detect_machine, measure, tune

    machine = detect_machine()
    if args.cpu:
        backend = "dali-cpu"
    elif machine.gpu is None:
        raise usage_error("benchmarks.tune: no GPU is visible (nvidia-smi lists none); pass --cpu for the CPU form")
    else:
        backend = "dali-gpu"
    if args.smoke:
        args.size, args.batch_size, args.crop_size, args.budget = "tiny", 32, 64, 4.0
        args.sweep_warmup, args.sweep_window, args.window, args.rounds, args.top = 0.05, 0.15, 0.3, 2, 2
    data = args.data or ensure_classification(args.data_root, size=args.size, formats=("imagefolder",)) / "imagefolder"
    source = resolve_source(data, "train")
    grid = default_grid(backend, machine, args.batch_size)
    defaults = default_settings(backend, machine)
    stem = "tune_cpu" if backend == "dali-cpu" else "tune"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "tune", "command": " ".join(["python", "-m", "benchmarks.tune", *sys.argv[1:]]),
        "gpu": machine.gpu if backend == "dali-gpu" else None, "gpu_name": gpu_name(), "cpu": cpu_model(),
        "cpus": machine.cpus, "python": platform.python_version(), "dali": __import__("nvidia.dali").dali.__version__,
        "backend": backend, "data": str(data), "samples": source.num_samples, "batch_size": args.batch_size,
        "crop_size": args.crop_size, "noise_margin": NOISE_MARGIN, "target_share": TARGET_SHARE,
        "grid": asdict(grid), "defaults": asdict(defaults),
    }
    print(f"tune: {backend}, {report['gpu'] or report['cpu']}, {machine.cpus} CPUs, batch {args.batch_size}, "
          f"{args.crop_size} px, grid of {grid.size()} configurations", flush=True)

    t0 = time.perf_counter()
    result = tune(source, backend=backend, batch_size=args.batch_size, crop_size=args.crop_size, budget_s=args.budget,
                  machine=machine, grid=grid, report=lambda line: print("  " + line, flush=True))
    report["tune"] = {"settings": asdict(result.best), "images_per_s": result.best_images_per_s,
                      "defaults_images_per_s": result.defaults_images_per_s, "trials": len(result.trials),
                      "confirmed": result.confirmed, "seconds": time.perf_counter() - t0, "budget_s": args.budget,
                      # each trial in order (a configuration measured twice appears twice): what the search saw
                      "trial_rates": [{**asdict(t.settings), "images_per_s": t.images_per_s, "seconds": t.seconds}
                                      for t in result.trials]}
    print(f"tuned in {report['tune']['seconds']:.1f} s: {result.best.label()}", flush=True)

    t0 = time.perf_counter()
    sweep, complete = [], True
    for settings in grid.configs():
        if time.perf_counter() - t0 > args.sweep_limit:
            complete = False
            break
        trial = measure(source, settings, backend=backend, batch_size=args.batch_size, crop_size=args.crop_size,
                        warmup_s=args.sweep_warmup, window_s=args.sweep_window, deadline=float("inf"))
        sweep.append({**asdict(settings), "images_per_s": trial.images_per_s})
        print(f"  sweep {len(sweep):3d}/{grid.size()}: {settings.label():<48} {trial.images_per_s:10,.0f} images/s",
              flush=True)
    report["sweep"] = {"configs": len(sweep), "of": grid.size(), "complete": complete,
                       "seconds": time.perf_counter() - t0, "results": sweep}

    by_rate = sorted(sweep, key=lambda r: -r["images_per_s"])
    from crossdali.common.tune import TuneSettings

    candidates = {}
    for row in by_rate[:args.top]:
        settings = TuneSettings(**{k: row[k] for k in ("workers", "hw_decoder_load", "pipelines", "prefetch")})
        candidates[_key(settings)] = settings
    candidates.setdefault(_key(result.best), result.best)
    candidates.setdefault(_key(defaults), defaults)
    rates: dict[tuple, list[float]] = {k: [] for k in candidates}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for key, settings in candidates.items():
            trial = measure(source, settings, backend=backend, batch_size=args.batch_size, crop_size=args.crop_size,
                            warmup_s=args.window / 2, window_s=args.window, deadline=float("inf"))
            rates[key].append(trial.images_per_s)
        print(f"  round {r + 1}/{args.rounds}: " + ", ".join(f"{candidates[k].label()}: {v[-1]:,.0f}"
                                                            for k, v in rates.items()), flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}  # one window disturbed by another process moves no row
    best_key = max(median, key=median.get)
    tuned_key, defaults_key = _key(result.best), _key(defaults)
    report["rounds"] = {
        "seconds": time.perf_counter() - t0, "window_s": args.window,
        "configs": [{**asdict(candidates[k]), "label": candidates[k].label(), "images_per_s": median[k], "rounds": v,
                     "tuned": k == tuned_key, "defaults": k == defaults_key, "best": k == best_key}
                    for k, v in rates.items()],
    }
    n = args.rounds
    report["best"] = {**asdict(candidates[best_key]), "images_per_s": median[best_key]}

    def ratio(a: tuple, b: tuple) -> dict:
        per_round = [rates[a][i] / rates[b][i] for i in range(n)]
        return {**round_spread(per_round), "median": statistics.median(per_round), "of_medians": median[a] / median[b]}

    report["tuned_share"] = ratio(tuned_key, best_key)
    report["defaults_share"] = ratio(defaults_key, best_key)
    report["tuned_over_defaults"] = ratio(tuned_key, defaults_key)
    report["meets_target"] = report["tuned_share"]["of_medians"] >= TARGET_SHARE
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    png = plot(report, args.out / f"{stem}.png")
    over = report["tuned_over_defaults"]
    print(f"tuned: {result.best.label()} = {report['tuned_share']['of_medians']:.1%} of the best "
          f"({candidates[best_key].label()}); defaults {report['defaults_share']['of_medians']:.1%}; tuned / defaults "
          f"{over['of_medians']:.3f} (per round {over['min']:.3f}-{over['max']:.3f})")
    print(f"wrote {args.out / (stem + '.json')}" + (f" and {png}" if png else ""))
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
