"""``crossdali check DATA``: find bad samples before training; write a JSON report and an exclusion list.

    crossdali check /data/imagenet                      # fast pass: headers, structure, indexes, annotations
    crossdali check /data/imagenet --depth full         # + decode every sample with DALI (GPU if present)
    python -m crossdali.pytorch.train_classification --data /data/imagenet --exclude check/exclude.txt

Exit status: 0 when nothing is wrong, 1 when some samples are bad (listed in the report).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from crossdali.common.data.check.images import DEFAULT_MAX_PIXELS
from crossdali.common.data.object_store import data_location
from crossdali.common.scripts.train_args import non_negative_int, positive_int


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crossdali check", description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=data_location,
                        help="dataset folder, or s3://bucket/prefix (every split and format under it is checked)")
    parser.add_argument("--depth", choices=("fast", "full"), default="fast",
                        help="fast: headers, structure, JPEG data at 1/8 scale; full: also decode every sample with DALI "
                             "(default: fast)")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="where the full pass decodes (auto: the GPU when DALI sees one)")
    parser.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help=f"largest width x height an image header may claim (default {DEFAULT_MAX_PIXELS:,})")
    parser.add_argument("--split", action="append", dest="splits", help="check only this split (repeatable)")
    parser.add_argument("--clip-len", type=int, default=8, help="video: frames per clip (shorter files are bad)")
    parser.add_argument("--frame-stride", type=int, default=1, help="video: stride between a clip's frames")
    parser.add_argument("-j", "--workers", type=positive_int, default=None,
                        help="reader threads and DALI threads (default: every core, up to 16)")
    parser.add_argument("--processes", type=non_negative_int, default=None,
                        help="processes reading image headers (default: half the cores for 4,096 files or more on "
                             "more than 4 cores, else none: threads only)")
    parser.add_argument("-b", "--batch-size", type=positive_int, default=None,
                        help="samples per DALI batch in the full pass (default: 64 on a GPU, 32 on the CPU)")
    parser.add_argument("--output-dir", "--out", type=Path, default=Path("check"),
                        help="where report.json and exclude.txt go (default: ./check)")
    parser.add_argument("--no-cache", action="store_true", help="check everything again, ignoring the cache")
    parser.add_argument("--cache-dir", default=None, help="cache folder (default: $CROSSDALI_CACHE/check)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(args: argparse.Namespace) -> int:
    from crossdali.common.data.check.report import check_data
    from crossdali.common.video import ClipTransform

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = check_data(args.data, depth=args.depth, device=args.device, max_pixels=args.max_pixels, splits=args.splits,
                        threads=args.workers, batch_size=args.batch_size, cache_dir=args.cache_dir,
                        use_cache=not args.no_cache, progress=not args.no_progress,
                        transform=ClipTransform(sequence_length=args.clip_len, stride=args.frame_stride),
                        processes=args.processes)
    report_path, exclude_path = report.write(args.output_dir)
    for s in report.splits:
        print(f"{s.kind:14s} {s.format:11s} {s.split:6s} {s.num_samples:7d} samples  {len(s.errors):5d} bad  "
              f"{len(s.problems) - len(s.errors):4d} warnings  {s.seconds:7.1f} s  {s.location}")
    errors = report.errors
    for p in errors[:20]:
        print(f"  {p.message}", file=sys.stderr)
    if len(errors) > 20:
        print(f"  ... and {len(errors) - 20} more in {report_path}", file=sys.stderr)
    excluded = len(set(p.sample for p in errors))
    print(f"report: {report_path}\nexclusion list ({excluded} sample{'' if excluded == 1 else 's'}): {exclude_path}"
          + (f"\ntrain on the rest with --exclude {exclude_path}" if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(get_args_parser().parse_args()))
