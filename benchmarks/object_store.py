"""Images/s of the PyTorch loader reading the same files from an S3-compatible server on the loopback
(``--data s3://...``) and from local disk, in interleaved rounds of one run.

    python -m benchmarks.object_store                               # on a GPU machine: results/latest
    python -m benchmarks.object_store --cpu --size small --out /tmp/os
    python -m benchmarks.object_store --smoke --out /tmp/os         # tiny CPU run (CI)

The server is moto's standalone S3 server (``python -m moto.server``, pinned in requirements/base.txt)
in a process of its own on 127.0.0.1, the ``bench`` sample set uploaded into it: an ImageFolder of
8,195 JPEGs and the same JPEGs as WebDataset shards. DALI's readers fetch the objects over HTTP
themselves (ranged GETs through DALI's AWS SDK), the local rows read the files from disk; both rows
of a format get the same ``DataSource`` layout, the same transform, threads and batch. moto is a
Python server (Werkzeug): what it serves per second bounds the S3 rows, so the ratio is what this
pipeline keeps against a slow object store on a fast network, not a property of S3 itself.

Each round times every row (one warm-up epoch, then whole epochs until at least 2 epochs and
``--min-seconds``; a row slower than that stops at ``--max-seconds``, inside an epoch); the ratio S3 / local of
each format is taken per round (``round_spread``). The JSON is written after every row.
Also recorded: the seconds ``resolve_source`` takes on each side (listing, index download, the
fast check of every object), and the server's ceiling: the JPEG objects/s it hands to as many boto3
threads as DALI has (``server_objects_per_s``) and to one thread, one request at a time
(``server_objects_per_s_one_thread``), each over the first ``CEILING_OBJECTS`` objects: an S3 row near the
one-thread figure fetches one object at a time. Writes ``object_store.json`` (rewritten after every row) and
``object_store.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from benchmarks import cpu_model, gpu_name, round_spread, usage_error

BUCKET = "crossdali-bench"
FORMATS = ("imagefolder", "webdataset")
CEILING_OBJECTS = 2000  # objects GET per server-ceiling figure: seconds at moto's rate, enough for a steady rate


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/latest"), help="folder for the JSON and the PNG")
    parser.add_argument("--data-root", type=Path, default=None, help="where to build the sample set")
    parser.add_argument("--size", default="bench", help="sample set size (bench: 8,195 JPEGs)")
    parser.add_argument("-b", "--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--workers", type=int, default=8, help="DALI threads")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every row")
    parser.add_argument("--max-seconds", type=float, default=40.0,
                        help="a row stops after this long, inside an epoch if need be (at moto's rate an epoch of "
                             "the bench set's JPEGs takes about a minute)")
    parser.add_argument("--min-seconds", type=float, default=5.0,
                        help="time whole epochs until at least this long (and at least 2 epochs) per row and round")
    parser.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    parser.add_argument("--cpu", action="store_true", help="DALI CPU rows, batches consumed on the CPU (no GPU needed)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny set, CPU rows, batch 32, 2 workers, 64 px, 1 round: checks the script runs")
    return parser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def moto_server(timeout: float = 60.0):
    """moto's S3 server in its own process on a free loopback port; yields its endpoint URL and stops it after
    (also the tests' server: tests/common/s3_server.py). Its own process: a thread of this process could not
    answer DALI, which opens its objects while building a pipeline with Python's lock held."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on port {port} (exit code {proc.poll()})") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _upload(folder: Path, prefix: str, *, only, threads: int = 16) -> tuple[str, int]:
    """The files under ``folder`` that ``only`` accepts, as ``s3://BUCKET/prefix/...``; (URL, bytes)."""
    from crossdali.common.data.object_store import s3_client

    client = s3_client()
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and only(p.relative_to(folder).as_posix())]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), BUCKET, f"{prefix}/{p.relative_to(folder).as_posix()}"), files))
    return f"s3://{BUCKET}/{prefix}", sum(p.stat().st_size for p in files)


def _server_ceiling(url: str, threads: int, limit: int = CEILING_OBJECTS) -> float:
    """Objects/s the server hands to ``threads`` boto3 threads GETting the first ``limit`` objects under ``url``
    once: what the server can serve at most, beside what DALI took from it."""
    from crossdali.common.data.object_store import ObjectLocation, s3_client

    client, loc = s3_client(), ObjectLocation.parse(url)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=loc.bucket, Prefix=loc.prefix + "/")
            for o in page.get("Contents", ())][:limit]
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: client.get_object(Bucket=loc.bucket, Key=k)["Body"].read(), keys))
    return len(keys) / (time.perf_counter() - start)


def _plot(report: dict, png: Path) -> bool:
    from benchmarks.plot import bar_png

    rows = [(f"{r['format']} {r['where']}", r["img_s"]) for r in report["rows"] if "img_s" in r]
    ratios = {f: s["mean"] for f, s in report["ratio_s3_to_local"].items()}
    colors = ["#4c72b0" if n.endswith("local") else "#dd8452" for n, _ in rows]
    return bar_png(png, [n for n, _ in rows], [v for _, v in rows], labels=[f"{v:,.0f}" for _, v in rows], width=10,
                   colors=colors,
                   xlabel="images/s, median of the rounds (higher is better)",
                   title=f"DALI {report['backend']} from S3 on the loopback (moto) vs local disk, batch "
                         f"{report['batch_size']}, {report['crop_size']} px\n{report['gpu'] or report['cpu']}; S3 / local: "
                         + ", ".join(f"{f} {r:.1%}" for f, r in ratios.items())) is not None


def main(args: argparse.Namespace) -> dict:
    import torch

    from benchmarks.loader_rows import environment, time_epochs
    from crossdali.common.data.sample_data import ensure_classification
    from crossdali.common.data.sources import resolve_source
    from crossdali.pytorch import create_classification_loader

    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError as e:
        raise usage_error(f"benchmarks.object_store needs boto3 and moto[server] ({e}): pip install boto3==1.44.8 "
                          "'moto[server]==5.2.5' (requirements/base.txt)") from None
    if args.smoke:
        args.size, args.batch_size, args.workers, args.crop_size = "tiny", 32, 2, 64
        args.min_seconds, args.cpu, args.rounds = 0.0, True, 1
    elif not args.cpu and not torch.cuda.is_available():
        raise usage_error("no CUDA GPU here: pass --cpu for the DALI CPU rows (or --smoke)")
    if args.max_seconds <= 0:
        raise usage_error(f"--max-seconds must be positive, got {args.max_seconds:g}")
    formats = [f for f in args.formats.split(",") if f]
    if not formats or set(formats) - set(FORMATS):
        raise usage_error(f"--formats {args.formats}: choose among {', '.join(FORMATS)}")
    gpu = not args.cpu
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    backend = "dali-gpu" if gpu else "dali-cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    root = ensure_classification(args.data_root, size=args.size, formats=("imagefolder", "webdataset"))
    report = {**environment("object_store", device), "gpu": gpu_name() if gpu else None, "cpu": cpu_model(),
              "size": args.size, "backend": backend, "batch_size": args.batch_size, "crop_size": args.crop_size,
              "workers": args.workers, "rounds": args.rounds, "server": "moto (python -m moto.server) on 127.0.0.1",
              "timing": f"1 warm-up epoch, then whole epochs until >= 2 epochs and >= {args.min_seconds:g} s, per round; "
                        f"a row stops at {args.max_seconds:g} s (its warm-up at a quarter of that)",
              "rows": [], "rounds_detail": [], "ratio_s3_to_local": {}, "resolve_seconds": {}, "dataset": {}}
    path = args.out / "object_store.json"
    aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    with moto_server() as endpoint:
        os.environ.update(aws, AWS_ENDPOINT_URL=endpoint)
        from crossdali.common.data.object_store import s3_client

        s3_client().create_bucket(Bucket=BUCKET)
        sources = {}
        for fmt in formats:
            t0 = time.perf_counter()
            url, size = _upload(root / fmt, fmt, only=lambda rel: rel.startswith("train"))
            upload_s = time.perf_counter() - t0
            for where, data in (("local", root / fmt), ("s3", url)):
                t0 = time.perf_counter()
                sources[fmt, where] = resolve_source(data, "train")
                report["resolve_seconds"][f"{fmt} {where}"] = round(time.perf_counter() - t0, 2)
            report["dataset"][fmt] = {"samples": sources[fmt, "local"].num_samples, "mib": round(size / 2**20, 1),
                                      "upload_seconds": round(upload_s, 1), "url": url}
            if fmt == "imagefolder":
                report["server_objects_per_s"] = round(_server_ceiling(url + "/train", args.workers), 1)
                report["server_objects_per_s_one_thread"] = round(_server_ceiling(url + "/train", 1), 1)
                print(f"server: {report['server_objects_per_s']:,.0f} objects/s to {args.workers} boto3 threads, "
                      f"{report['server_objects_per_s_one_thread']:,.0f} to one", flush=True)
            print(f"{fmt}: {sources[fmt, 'local'].num_samples} samples, {size / 2**20:.0f} MiB uploaded in {upload_s:.0f} s; "
                  f"resolve local {report['resolve_seconds'][f'{fmt} local']} s, s3 "
                  f"{report['resolve_seconds'][f'{fmt} s3']} s", flush=True)
        common = dict(train=True, backend=backend, batch_size=args.batch_size, crop_size=args.crop_size,
                      workers=args.workers, device_id=0 if gpu else None)
        for r in range(args.rounds):
            detail = {}
            for fmt in formats:
                for where in ("local", "s3") if r % 2 == 0 else ("s3", "local"):  # alternate which goes first
                    loader = create_classification_loader(sources[fmt, where], **common)
                    timed = time_epochs(loader, device, min_seconds=args.min_seconds, max_seconds=args.max_seconds)
                    detail[f"{fmt} {where}"] = timed["img_s"]
                    del loader
                    print(f"round {r + 1}: {fmt:12s} {where:6s} {detail[f'{fmt} {where}']:9,.0f} img/s"
                          + (f" (stopped at {args.max_seconds:g} s, {timed['images']} images)" if timed["capped"] else ""),
                          flush=True)
                    report["round_in_progress"] = detail  # a run cut short keeps what it measured
                    path.write_text(json.dumps(report, indent=2) + "\n")
            report.pop("round_in_progress", None)
            report["rounds_detail"].append(detail)
            report["rows"] = []
            for fmt in formats:
                for where in ("local", "s3"):
                    values = sorted(d[f"{fmt} {where}"] for d in report["rounds_detail"])
                    report["rows"].append({"format": fmt, "where": where, "img_s": values[len(values) // 2],
                                           "rounds": values})
                report["ratio_s3_to_local"][fmt] = round_spread(
                    [d[f"{fmt} s3"] / d[f"{fmt} local"] for d in report["rounds_detail"]])
            path.write_text(json.dumps(report, indent=2) + "\n")
    for fmt, spread in report["ratio_s3_to_local"].items():
        print(f"{fmt}: S3 / local {spread['mean']:.1%} (rounds {spread['min']:.1%} - {spread['max']:.1%})")
    if _plot(report, args.out / "object_store.png"):
        print(f"wrote {path} and {path.with_suffix('.png')}")
    else:
        print(f"wrote {path} (no matplotlib here: no plot)")
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
