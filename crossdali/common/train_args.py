"""The command-line flags every classification training script shares, defined once so the
PyTorch, TensorFlow and MXNet scripts cannot drift apart (issue: "the same flags as the PyTorch
script where they apply"). Each script adds what only it has (``--amp``, ``--channels-last``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from crossdali.common.sample_data import SIZES

__all__ = ["add_classification_data_args", "add_run_args"]


def add_classification_data_args(parser: argparse.ArgumentParser, *, backends: tuple[str, ...], arch: str,
                                 arch_help: str, workers_help: str, backend_help: str | None = None) -> None:
    """Data, model and optimiser flags (torchvision references' names and defaults)."""
    parser.add_argument("--data", type=Path, default=None,
                        help="dataset folder: ImageFolder (train/, val/), TFRecord, RecordIO or file lists; "
                             "default: the embedded sample set (built if missing)")
    parser.add_argument("--data-format", default="auto", choices=["auto", "imagefolder", "tfrecord", "recordio", "filelist"])
    parser.add_argument("--sample-size", default="small", choices=sorted(SIZES), help="sample set size when --data is not given")
    parser.add_argument("--data-backend", default="auto", choices=["auto", *backends], help=backend_help)
    parser.add_argument("--arch", default=arch, help=arch_help)
    parser.add_argument("--num-classes", type=int, default=None, help="default: from the dataset (needed for record formats)")
    parser.add_argument("-b", "--batch-size", type=int, default=128, help="images per process per step")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate for a global batch of 256 (scaled linearly)")
    parser.add_argument("--lr-warmup-epochs", type=float, default=5, help="linear warm-up, then cosine decay")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=1e-4)
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("-j", "--workers", type=int, default=4, help=workers_help)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--hw-decoder-load", type=float, default=1.0, help="share of JPEGs for the hardware decoder (dali-gpu)")


def add_run_args(parser: argparse.ArgumentParser, *, engines: tuple[str, ...] | list[str], engine_help: str,
                 resume_help: str) -> None:
    """Distributed engine, checkpointing, logging and evaluation-only flags."""
    parser.add_argument("--engine", default="auto", choices=list(engines), help=engine_help)
    parser.add_argument("--resume", type=Path, default=None, help=resume_help)
    parser.add_argument("--output-dir", type=Path, default=None, help="checkpoints and metrics.jsonl go here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--print-freq", type=int, default=10, help="steps between progress lines")
    parser.add_argument("--test-only", action="store_true", help="only evaluate (with --resume)")
