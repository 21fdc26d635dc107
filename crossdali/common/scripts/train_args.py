"""The command-line flags every training script shares, defined once so the scripts cannot drift
apart (issue: "the same flag set for every framework's classification script ... and for SSD and
video where it makes sense").

A script builds its parser from groups, each with keyword-only defaults for what differs between
tasks (an SSD step is not a ResNet-50 step)::

    parser = create_parser("crossdali PyTorch classification training")
    add_data_args(parser, backends=BACKENDS, data_help="...")
    add_model_args(parser, arch="resnet50", framework="pytorch")
    add_optimizer_args(parser, batch_size=128, epochs=90, lr=0.1, lr_batch=256)
    add_run_args(parser, engines=ENGINES, amp=True, channels_last=True, checkpoint_every=True)

``--help`` shows every default. Nothing here imports a framework: the TensorFlow and MXNet scripts
use the same functions (``add_classification_data_args`` and ``add_run_args`` keep the keyword
signatures they call).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from crossdali.common.augment import AUTO_AUGMENT_HELP, AUTO_AUGMENT_POLICIES, check_auto_augment
from crossdali.common.data.object_store import data_location
from crossdali.common.data.sample_data import SIZES
from crossdali.common.errors import UsageError
from crossdali.common.models import LIST_COMMAND, arch_type
from crossdali.common.scripts.defaults import AUTO_HELP

__all__ = ["TrainArgumentParser",
           "create_parser", "log_accepted_flags", "add_data_args", "add_model_args", "add_optimizer_args",
           "add_classification_data_args", "add_run_args", "resolve_auto_augment", "resolve_backend",
           "resolve_num_classes", "positive_int", "non_negative_int"]

log = logging.getLogger(__name__)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``(default: X)`` after every option's help, also for options without a help text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or " "
        if "%(default)" in help_text or action.default in (None, argparse.SUPPRESS) or not action.option_strings:
            return help_text
        if isinstance(action, argparse._StoreTrueAction) and action.default is False:
            return help_text  # "(default: False)" after every on/off switch is noise
        return f"{help_text.rstrip()} (default: %(default)s)"


class TrainArgumentParser(argparse.ArgumentParser):
    """argparse with a one-line error (issue: "a user's mistake prints one clear line and exits 2")."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def create_parser(description: str, *, add_help: bool = True) -> TrainArgumentParser:
    """An empty parser whose ``--help`` lists every default and whose errors are one line."""
    return TrainArgumentParser(description=description, add_help=add_help, formatter_class=_HelpFormatter)


def positive_int(text: str) -> int:
    """argparse ``type``: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse ``type``: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _unit_float(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def add_data_args(parser: argparse.ArgumentParser, *, backends: Sequence[str], data_help: str,
                  sample_sizes: Sequence[str] = tuple(SIZES), sample_size: str = "small", workers: int | None = 4,
                  workers_help: str = "DALI threads (or loader workers) per process", backend_help: str | None = None,
                  data_formats: Sequence[str] | None = None, hw_decoder_load: bool = True,
                  crop_size: int | None = 224) -> None:
    """Where the data comes from and how it is loaded. ``data_formats``/``crop_size``/
    ``hw_decoder_load`` add those flags only where the task has them (None/False: left out);
    ``workers=None``: ``-j`` from the machine (``crossdali.common.scripts.defaults``)."""
    group = parser.add_argument_group("data")
    group.add_argument("--data", type=data_location, default=None,
                       help=f"{data_help}; default: the embedded sample set (built if missing)")
    if data_formats:
        group.add_argument("--data-format", default="auto", choices=["auto", *data_formats], help="dataset layout")
    group.add_argument("--sample-size", default=sample_size, choices=sorted(sample_sizes),
                       help="sample set size when --data is not given")
    group.add_argument("--data-backend", default="auto", choices=["auto", *backends],
                       help=backend_help or "input pipeline; auto: dali-gpu when a GPU is visible, else dali-cpu")
    group.add_argument("-j", "--workers", type=positive_int, default=workers,
                       help=workers_help + (AUTO_HELP["workers"] if workers is None else ""))
    if crop_size is not None:
        group.add_argument("--crop-size", type=positive_int, default=crop_size, help="training crop / val centre crop, pixels")
    if hw_decoder_load:
        group.add_argument("--hw-decoder-load", type=_unit_float, default=1.0,
                           help="share of JPEGs for the hardware decoder (dali-gpu)")
    group.add_argument("--exclude", type=Path, default=None, metavar="FILE",
                       help="samples to leave out: the exclude.txt that `crossdali check` writes (logged, never silent)")
    group.add_argument("--skip-check", action="store_true",
                       help="skip the fast data check before training (cached by path, size and mtime, so a second "
                            "start is quick); a bad sample then stops training inside DALI")


def add_model_args(parser: argparse.ArgumentParser, *, arch: str, arches: Sequence[str] | None = None,
                   arch_help: str = "model name", num_classes: bool = False, framework: str | None = None) -> None:
    """``--arch``, checked by argparse before any data is read: against the classifiers' table
    ``crossdali.common.models`` for ``framework`` (when given; no framework is imported), else
    against ``arches`` (when given)."""
    group = parser.add_argument_group("model")
    if framework is not None:
        group.add_argument("--arch", default=arch, type=arch_type(framework), metavar="ARCH",
                           help=f"{arch_help}; the same names in every framework that has the model "
                                f"(`{LIST_COMMAND}` lists them)")
    elif arches is not None:
        if arch not in arches:
            raise ValueError(f"default arch {arch!r} is not among the choices {list(arches)}")
        group.add_argument("--arch", default=arch, choices=list(arches), metavar="ARCH",
                           help=f"{arch_help}; one of {', '.join(arches)}")
    else:
        group.add_argument("--arch", default=arch, help=arch_help)
    if num_classes:
        group.add_argument("--num-classes", type=positive_int, default=None,
                           help="default: from the dataset (needed for record formats without labels metadata)")


def add_optimizer_args(parser: argparse.ArgumentParser, *, batch_size: int | None, epochs: int, lr: float,
                       lr_batch: int | None = 256, lr_warmup_epochs: float = 5.0, opt: str = "sgd",
                       opts: Sequence[str] = ("sgd", "adamw"), momentum: float = 0.9, weight_decay: float = 1e-4,
                       label_smoothing: bool = True, batch_help: str = "samples per process per step",
                       batch_default_help: str | None = None) -> None:
    """Batch, epochs and the optimiser (torchvision references' names). ``lr_batch``: ``--lr`` is
    for a global batch of that size and scales linearly (None: not scaled); ``batch_size=None``: from
    the machine (``crossdali.common.scripts.defaults``, or as ``batch_default_help`` says)."""
    group = parser.add_argument_group("optimisation")
    group.add_argument("-b", "--batch-size", type=positive_int, default=batch_size,
                       help=batch_help + ((batch_default_help or AUTO_HELP["batch_size"]) if batch_size is None else ""))
    group.add_argument("--epochs", type=positive_int, default=epochs, help="epochs to train (in total, also when resuming)")
    if len(opts) > 1:
        group.add_argument("--opt", default=opt, choices=list(opts), help="optimiser")
    else:
        parser.set_defaults(opt=opt)
    lr_help = (f"learning rate for a global batch of {lr_batch}, scaled linearly (Goyal et al., 2017): the run "
               f"trains with lr x batch-size x processes / {lr_batch}, and its start line says so" if lr_batch
               else "learning rate")
    group.add_argument("--lr", type=float, default=lr, help=lr_help)
    group.add_argument("--lr-warmup-epochs", type=_non_negative_float, default=lr_warmup_epochs,
                       help="linear warm-up (epochs, may be fractional), then cosine decay to 0")
    group.add_argument("--momentum", type=float, default=momentum, help="SGD momentum")
    group.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=weight_decay,
                       help="weight decay")
    if label_smoothing:
        group.add_argument("--label-smoothing", type=float, default=0.0, help="cross-entropy label smoothing")


def add_classification_data_args(parser: argparse.ArgumentParser, *, backends: tuple[str, ...], arch: str,
                                 arch_help: str, workers_help: str, backend_help: str | None = None,
                                 arches: Sequence[str] | None = None, framework: str | None = None) -> None:
    """Data, model and optimiser flags of a classification script (torchvision references' names and
    defaults); ``-b`` and ``-j`` default from the machine (``crossdali.common.scripts.defaults``)."""
    add_data_args(parser, backends=backends, workers=None, workers_help=workers_help, backend_help=backend_help,
                  data_help="dataset folder: ImageFolder (train/, val/), TFRecord, RecordIO, WebDataset shards or file lists",
                  data_formats=("imagefolder", "tfrecord", "recordio", "webdataset", "filelist"))
    parser.add_argument_group("augmentation").add_argument(
        "--auto-augment", default="none", choices=AUTO_AUGMENT_POLICIES, help=AUTO_AUGMENT_HELP)
    add_model_args(parser, arch=arch, arches=arches, arch_help=arch_help, num_classes=True, framework=framework)
    add_optimizer_args(parser, batch_size=None, epochs=90, lr=0.1, lr_batch=256, lr_warmup_epochs=5, opts=("sgd",))


def add_run_args(parser: argparse.ArgumentParser, *, engines: Sequence[str], engine_help: str = "gradient averaging",
                 resume_help: str = "checkpoint to resume from", print_freq: int = 10, amp: bool = False,
                 amp_help: str = "mixed precision (float16 + loss scaling on GPU, bfloat16 on CPU)",
                 amp_default: bool | None = False,
                 channels_last: bool = False, channels_last_help: str = "NHWC memory format for the model",
                 channels_last_default: bool | None = False,
                 checkpoint_every: bool = False, checkpoint_every_default: int = 1000,
                 checkpoint_every_help: str = "also save checkpoint_last every N steps (0: only at epoch ends and on "
                                              "SIGTERM/SIGINT)",
                 run_dir: bool = False, debug: bool = False) -> None:
    """Engine, precision, checkpoints, logging and evaluation-only flags.

    ``amp``/``channels_last``/``checkpoint_every``/``debug`` add those flags where the script
    implements them (``debug``: the script runs under ``crossdali.common.scripts.script.run``); ``run_dir``:
    the script writes to a default run folder when ``--output-dir`` is not given. ``--amp`` and
    ``--channels-last`` come with ``--no-amp``/``--no-channels-last``; ``amp_default``/
    ``channels_last_default`` None: on where a CUDA GPU trains (``crossdali.common.scripts.defaults``).
    """
    group = parser.add_argument_group("run")
    group.add_argument("--engine", default="auto", choices=list(engines), help=engine_help)
    if amp:
        group.add_argument("--amp", action=argparse.BooleanOptionalAction, default=amp_default,
                           help=amp_help + (AUTO_HELP["amp"] if amp_default is None else ""))
    if channels_last:
        group.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=channels_last_default,
                           help=channels_last_help + (AUTO_HELP["channels_last"] if channels_last_default is None else ""))
    group.add_argument("--resume", type=Path, default=None, help=resume_help)
    group.add_argument("--test-only", action="store_true", help="only evaluate (the --resume checkpoint's weights)")
    output_help = "checkpoints, metrics.jsonl and the plot go here"
    if run_dir:
        output_help += "; default: the --resume checkpoint's folder, else runs/<task>-<framework>-<arch>-<time>"
    group.add_argument("--output-dir", type=Path, default=None, help=output_help)
    if checkpoint_every:
        group.add_argument("--checkpoint-every", type=non_negative_int, default=checkpoint_every_default,
                           help=checkpoint_every_help)
    group.add_argument("--seed", type=int, default=0, help="fixes the weights, the data order and the augmentation")
    group.add_argument("--print-freq", type=non_negative_int, default=print_freq,
                       help="steps between progress lines in logs (0: none)")
    if debug:
        group.add_argument("--debug", action="store_true", help="tracebacks for user errors too, and debug logs")


def resolve_backend(requested: str, *, gpu: str | None, gpu_note: str = "DALI mixed decoder",
                    cpu_note: str = "DALI runs all operators on the CPU",
                    no_gpu: str = "a CUDA GPU and none is visible") -> str:
    """``--data-backend auto`` made concrete, and said in one log line; ``gpu`` is the visible GPU's
    name (None: no GPU). A GPU backend asked for without a GPU is a user error, named here before
    any data is read (``no_gpu``: what is missing, in the framework's words)."""
    if requested == "auto":
        if gpu is not None:
            log.info("data backend: dali-gpu (%s on %s)", gpu_note, gpu)
            return "dali-gpu"
        log.info("data backend: dali-cpu (no CUDA GPU visible: %s)", cpu_note)
        return "dali-cpu"
    if requested == "dali-gpu" and gpu is None:
        raise UsageError(f"--data-backend dali-gpu needs {no_gpu}; use --data-backend dali-cpu")
    log.info("data backend: %s", requested)
    return requested


def resolve_auto_augment(args: argparse.Namespace, *, backend: str) -> str:
    """``--auto-augment`` for the train loader, refused (a ``UsageError``: one line, exit 2) before any data is
    read where nothing would run it: a backend without a DALI pipeline, or ``--multi-label``, whose
    external-source loader has no policy."""
    policy = check_auto_augment(getattr(args, "auto_augment", "none"), backend=backend)
    if policy != "none" and getattr(args, "multi_label", False):
        raise UsageError(f"--auto-augment {policy} applies to single-label classification; leave it out with "
                         "--multi-label")
    if policy != "none":
        log.info("augmentation policy: %s (docs/benchmarks.md#auto-augment)", policy)
    return policy


def resolve_num_classes(given: int | None, found: int, *, data_format: str, data) -> int:
    """``--num-classes`` when given, else what the dataset says (``found``: 0 when it cannot tell, as for
    TFRecord or RecordIO records without label metadata). Neither: a user error, named before training."""
    if given:
        return given
    if not found:
        raise UsageError(f"cannot tell the number of classes of the {data_format} data at {data}: pass --num-classes")
    return found


def log_accepted_flags(args: argparse.Namespace, *, channels_last: str | None = None,
                       checkpoint_every: str | None = None) -> None:
    """One start-up line for each shared flag a framework's script accepts but does not act on, so
    the same command line runs everywhere and nobody is left guessing what it did."""
    if channels_last and getattr(args, "channels_last", False):
        log.info("--channels-last: %s", channels_last)
    if checkpoint_every and getattr(args, "checkpoint_every", 0):
        log.warning("--checkpoint-every %d: %s", args.checkpoint_every, checkpoint_every)
