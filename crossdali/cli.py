"""The ``crossdali`` command (also ``python -m crossdali``): one entry point for what a user reaches for.

    crossdali info                                  what is installed, what --data-backend auto picks here
    crossdali make-data [--kind K] [--size S]       build the embedded sample datasets
    crossdali check DATA                            find bad samples before training
    crossdali train TASK [--framework F] [...]      run a training script (its own flags follow)
    crossdali plot RUN_DIR                          curves of a run (loss, top-1, images/s, data wait)
    crossdali predict CHECKPOINT IMAGE...           top classes of images (PyTorch checkpoint)
    crossdali models [--framework F]                the --arch names, and which frameworks have each
    crossdali bench NAME [...]                      a benchmark script of the source checkout
    crossdali tune --data DIR [--budget 60]         the fastest loader settings for a dataset here (docs/tuning.md)

Nothing heavy is imported before a command runs (``--help`` answers in well under a second); each
command imports only what it needs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

__all__ = ["TRAIN_SCRIPTS", "FRAMEWORKS", "main", "get_args_parser"]

#: (task, framework) -> the module whose ``get_args_parser``/``main`` ``crossdali train`` runs.
TRAIN_SCRIPTS: dict[tuple[str, str], str] = {
    ("classification", "pytorch"): "crossdali.pytorch.train_classification",
    ("classification", "tensorflow"): "crossdali.tensorflow.train_classification",
    ("classification", "mxnet"): "crossdali.mxnet.train_classification",
    ("classification", "jax"): "crossdali.jax.train_classification",
    ("detection", "pytorch"): "crossdali.detection_ssd.train",
    ("video", "pytorch"): "crossdali.video.train",
    ("optical-flow", "pytorch"): "crossdali.video.optical_flow",
}
#: framework -> the module that must be importable for it (looked up, never imported, by ``info``/``train``).
FRAMEWORKS = {"pytorch": "torch", "tensorflow": "tensorflow", "jax": "jax", "mxnet": "mxnet"}
BENCHMARKS = ("classification_loaders", "detection_loaders", "video_decode", "multi_gpu", "check_speed", "tf_vs_torch",
              "external_source", "inference", "training_speed", "loader_formats", "soak", "proxy_loader",
              "predict_latency", "object_store", "tune", "gpu_timeline")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the description's line breaks kept."""


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crossdali", description=__doc__.replace("``", ""), formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sub.add_parser("info", help="DALI, GPUs, installed frameworks and what --data-backend auto picks",
                   formatter_class=_Formatter)
    sub.add_parser("make-data", help="build the embedded sample datasets", add_help=False)
    sub.add_parser("check", help="check every sample of a dataset (report + exclusion list)", add_help=False)
    sub.add_parser("predict", help="top classes of images with a trained PyTorch checkpoint", add_help=False)

    models = sub.add_parser("models", help="the --arch names of the classification scripts, per framework",
                            formatter_class=_Formatter)
    models.add_argument("--framework", choices=list(FRAMEWORKS), default=None,
                        help="only the names this framework has (default: every name, a column per framework)")

    train = sub.add_parser("train", help="run a training script: crossdali train TASK [--framework F] [script flags]",
                           formatter_class=_Formatter,
                           description="Runs the training script for TASK and FRAMEWORK with the flags that follow "
                                       "(`crossdali train classification --help` shows the script's own flags).")
    train.add_argument("task", choices=sorted({t for t, _ in TRAIN_SCRIPTS}))
    train.add_argument("--framework", choices=list(FRAMEWORKS), default=None,
                       help="default: the first installed of pytorch, tensorflow, jax, mxnet that has this task")

    plot = sub.add_parser("plot", help="PNG of a run's curves from its metrics.jsonl", formatter_class=_Formatter)
    plot.add_argument("run_dir", type=Path, help="a run folder (holds metrics.jsonl); writes RUN_DIR/curves.png")

    bench = sub.add_parser("bench", help="run a benchmark of the source checkout (benchmarks/NAME.py)",
                           description="Runs benchmarks/NAME.py of the source checkout with the flags that follow "
                                       "(`crossdali bench NAME --help` shows them).")
    bench.add_argument("name", choices=BENCHMARKS)

    tune = sub.add_parser("tune", help="measure the fastest DALI threads, decoder share, pipelines and prefetch for a "
                                       "dataset on this machine; training scripts then use them", formatter_class=_Formatter)
    from crossdali.common.tune import add_tune_args  # light: imports nothing of DALI until it measures

    add_tune_args(tune)
    return parser


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _default_framework(task: str) -> str:
    for framework, module in FRAMEWORKS.items():
        if (task, framework) in TRAIN_SCRIPTS and _installed(module):
            return framework
    have = [f for f in FRAMEWORKS if (task, f) in TRAIN_SCRIPTS]
    raise SystemExit(f"crossdali train {task}: none of {', '.join(have)} is installed; install one, e.g. "
                     "`pip install -r requirements/pytorch.txt -e .` from the source checkout")


def _run_script(module_name: str, argv: list[str]) -> int:
    """Run a script module's ``main`` under ``crossdali.common.scripts.script.run`` (a user's mistake is one
    line and exit 2), or the module's own ``run(argv)`` where it has one."""
    module = importlib.import_module(module_name)
    own_run = getattr(module, "run", None)
    if callable(own_run) and own_run.__module__ == module.__name__:
        return own_run(argv) or 0
    from crossdali.common.scripts.script import run

    result = {}

    def main(args):
        result["value"] = module.main(args)

    run(main, module.get_args_parser(), argv)
    value = result.get("value")
    return value if isinstance(value, int) else 0


def _train(args: argparse.Namespace, rest: list[str]) -> int:
    framework = args.framework or _default_framework(args.task)
    module = TRAIN_SCRIPTS.get((args.task, framework))
    if module is None:
        have = sorted(f for t, f in TRAIN_SCRIPTS if t == args.task)
        raise SystemExit(f"crossdali train {args.task}: no {framework} script; this task exists for {', '.join(have)}")
    if not _installed(FRAMEWORKS[framework]):
        raise SystemExit(f"crossdali train {args.task} --framework {framework}: {framework} is not installed here "
                         f"(`pip install -r requirements/{framework}.txt -e .` from the source checkout)")
    prog = f"crossdali train {args.task} --framework {framework}"
    sys.argv = [prog, *rest]  # the script's usage line
    parsers = _script_parsers()
    if (args.task, framework) in parsers:  # --help and flag mistakes answered before the framework loads
        parser = parsers[(args.task, framework)]()
        parser.prog = prog
        data = getattr(parser.parse_args(rest), "data", None)
        if data is not None and not data.exists():
            raise SystemExit(f"{prog}: error: --data {data} does not exist; pass the folder of your dataset "
                             "(or leave --data out for the embedded sample set)")
    return _run_script(module, rest)


def _script_parsers() -> dict:
    from crossdali.common.scripts.script_parsers import PARSERS

    return PARSERS


def _bench(name: str, rest: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / f"{name}.py").is_file():
        raise SystemExit(f"crossdali bench {name}: benchmarks/ ships with the source checkout, not with an installed "
                         f"package; run it from a clone (python -m benchmarks.{name})")
    sys.path.insert(0, str(root))
    sys.argv = [f"crossdali bench {name}", *rest]
    return _run_script(f"benchmarks.{name}", rest)


def _take_framework(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--framework F`` (or ``--framework=F``) anywhere after the task, and the script's flags without it."""
    framework, rest, i = None, [], 0
    while i < len(argv):
        if argv[i] == "--framework":
            if i + 1 >= len(argv):
                raise SystemExit(f"crossdali train: --framework needs a value ({', '.join(FRAMEWORKS)})")
            framework, i = argv[i + 1], i + 2
        elif argv[i].startswith("--framework="):
            framework, i = argv[i].split("=", 1)[1], i + 1
        else:
            rest.append(argv[i])
            i += 1
    if framework is not None and framework not in FRAMEWORKS:
        raise SystemExit(f"crossdali train: --framework {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    return framework, rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = get_args_parser()
    if not argv:
        parser.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    asks_help = not rest or rest[0] in ("-h", "--help")
    # commands whose flags belong to another parser: only the command (and its first word) is parsed here
    if command == "make-data":
        sys.argv = ["crossdali make-data", *rest]
        return _run_script("crossdali.common.data.sample_data.__main__", rest)
    if command == "check":
        sys.argv = ["crossdali check", *rest]
        return _run_script("crossdali.common.data.check.__main__", rest)
    if command == "predict":
        sys.argv = ["crossdali predict", *rest]
        return _run_script("crossdali.pytorch.predict", rest)
    if command in ("train", "bench") and asks_help:
        parser.parse_args([command, "--help"])  # prints the command's help and exits 0
    if command == "train":
        tasks = sorted({t for t, _ in TRAIN_SCRIPTS})
        if rest[0].startswith("-"):
            raise SystemExit(f"crossdali train: the task comes first, one of {', '.join(tasks)} "
                             f"(e.g. crossdali train classification {' '.join(rest)})")
        if rest[0] not in tasks:
            raise SystemExit(f"crossdali train: unknown task {rest[0]!r}; choose one of {', '.join(tasks)}")
        framework, script_args = _take_framework(rest[1:])
        return _train(argparse.Namespace(task=rest[0], framework=framework), script_args)
    if command == "bench":
        if rest[0] not in BENCHMARKS:
            raise SystemExit(f"crossdali bench: unknown benchmark {rest[0]!r}; choose one of {', '.join(BENCHMARKS)}")
        return _bench(rest[0], rest[1:])
    args = parser.parse_args(argv)
    if args.command == "info":
        from crossdali.common.scripts.info import print_info  # defer: it imports DALI

        print_info()
        return 0
    if args.command == "models":
        from crossdali.common.models import format_table

        print(format_table(args.framework))
        return 0
    if args.command == "plot":
        from crossdali.common.scripts.runs import plot_run  # defer: matplotlib

        if not (args.run_dir / "metrics.jsonl").is_file():
            raise SystemExit(f"crossdali plot: {args.run_dir} has no metrics.jsonl; pass a run folder "
                             "(a training script's --output-dir, by default runs/<task>-<framework>-<arch>-<time>)")
        print(plot_run(args.run_dir))
        return 0
    if args.command == "tune":
        from crossdali.common.errors import DataError, UsageError
        from crossdali.common.tune import main as tune_main

        try:
            return tune_main(args)
        except (DataError, UsageError) as e:
            raise SystemExit(f"crossdali tune: error: {e}") from None
    parser.print_help()
    return 2


def entry_point() -> None:
    """Console-script entry: exit with main's code (2 and one line for a user's mistake)."""
    try:
        code = main()
    except SystemExit as e:
        if isinstance(e.code, str):  # a message for the user, not a traceback
            print(e.code, file=sys.stderr)
            raise SystemExit(2) from None
        raise
    except ImportError as e:  # outside a script's run(), e.g. `crossdali plot` without matplotlib
        from crossdali.common.scripts.script import missing_dependency_line

        line = missing_dependency_line(e, prog="crossdali")
        if line is None or "--debug" in sys.argv:
            raise
        print(line, file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code)
