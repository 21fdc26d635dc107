"""``python -m crossdali.common.data.sample_data``: build the embedded sample datasets."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from crossdali.common.data.sample_data import BUILDERS, SIZES, default_root


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help)
    parser.add_argument("--kind", choices=[*BUILDERS, "all"], default="all", help="which dataset(s) to build")
    parser.add_argument("--size", choices=sorted(SIZES), default="small", help="tiny (CI), small (default), bench")
    parser.add_argument("--root", type=Path, default=None, help="output root (default: $CROSSDALI_DATA or ~/.cache/crossdali)")
    parser.add_argument("--formats", default="imagefolder,tfrecord,recordio,webdataset",
                        help="classification formats to write (comma-separated; imagefolder is always written)")
    return parser


def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = args.root if args.root is not None else default_root()
    kinds = list(BUILDERS) if args.kind == "all" else [args.kind]
    for kind in kinds:
        start = time.perf_counter()
        kwargs = {"formats": tuple(args.formats.split(","))} if kind == "classification" else {}
        folder = BUILDERS[kind](root, args.size, **kwargs)
        print(f"{kind} ({args.size}): {folder}  [{time.perf_counter() - start:.1f} s]")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
