"""Which damaged JPEGs DALI's CPU and GPU decoders refuse, and in which batches (the checker's full pass).

    python -m benchmarks.probes.decode_failure_probe --out OUT

The checker's full pass names what DALI's decoder refuses. Its GPU pass has let
through a JPEG without quantization tables (the test corpus's ``nodqt.jpg``) that libjpeg-turbo
refuses. This records, for two photos (a 128x96 gradient, and the test corpus's photo from the tiny
sample set) each damaged in ways the fast pass's marker walk may not look at: what the fast pass
says, and per device whether DALI's decoder fails on the damaged photo alone (``sync-bad``), in a
batch after a good one (``sync-good-bad``; ``default``, a loader's executor, also gives how far a
"successful" decode is from the good photo's pixels, mean absolute difference 0-255), and in the
full pass's pipelined stream of 10 batches of 4 (``stream``). Each row runs in its own process, so
one failure cannot change the next. The test corpus's decode-only failure must be refused in every
row. Writes OUT/decode_failure_probe.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import numpy as np

PHOTOS = ("gradient", "corpus")
CONFIGS = ("sync-bad", "sync-good-bad", "default", "stream")


def _photo(which: str) -> bytes:
    if which == "corpus":
        from crossdali.common.data.sample_data import ensure_classification
        from tests.conformance import corpus

        root = Path(os.environ.get("CROSSDALI_DATA", "/tmp/crossdali-data"))
        return corpus._photo(ensure_classification(root, size="tiny"))
    from PIL import Image

    y, x = np.mgrid[0:96, 0:128]
    rgb = np.stack([x * 2, y * 2, (x + y)], axis=-1).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def cases(good: bytes) -> dict[str, bytes]:
    from tests.conformance.corpus import _without_dqt, patched

    return {
        "good": good,
        "no-dqt": _without_dqt(good),
        "sos-unknown-component": patched(good, 0xDA, 1, 9),
        "undefined-huffman-table": patched(good, 0xDA, 2, 0x33),
        "bogus-huffman-counts": patched(good, 0xC4, 1, 255),  # the corpus's "bad-huffman"
        "zero-sampling-factors": patched(good, 0xC0, 7, 0x00),
        "precision-12": patched(good, 0xC0, 0, 12),
    }


def _arrays(*encoded: bytes) -> list[np.ndarray]:
    return [np.frombuffer(x, np.uint8) for x in encoded]


def _described(error: str | None) -> str | None:
    from crossdali.common.data.check.decode import describe_dali_error

    return None if error is None else describe_dali_error(error)


def one(case: str, config: str, device: str, photo: str) -> dict:
    """One damaged photo through one way of decoding it, in this process (the caller isolates)."""
    from crossdali.common.data.check import decode as d

    good = _photo(photo)
    data = cases(good)[case]
    row: dict = {"case": case, "photo": photo, "config": config, "device": device}
    if config == "stream":
        bad = d.decode_samples([(f"s{i}", data if i == 5 else good) for i in range(40)], device=device,
                               batch_size=4, threads=2)
        row["named"] = {k: list(v) for k, v in bad.items()}
    elif config in ("sync-bad", "sync-good-bad"):  # the full pass's suspect search: one batch, nothing in flight
        dec = d._Decoder(device=device, batch_size=2, threads=1)
        error, lines = dec.run(_arrays(data) if config == "sync-bad" else _arrays(good, data))
        after, after_lines = dec.run(_arrays(good))  # does an error arrive one run late?
        row.update(error=_described(error), stderr=lines[-3:], next_error=_described(after),
                   next_stderr=after_lines[-3:])
    elif config == "default":
        from nvidia.dali import fn, pipeline_def, types

        batches = [_arrays(good, data), _arrays(good, good)]

        @pipeline_def(batch_size=2, num_threads=1, device_id=0 if device == "gpu" else None)
        def pipe():
            raw = fn.external_source(source=lambda: batches.pop(0) if batches else _arrays(good, good),
                                     dtype=types.UINT8)
            return fn.decoders.image(raw, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)

        p = pipe()
        p.build()
        for i in range(2):
            try:
                (out,) = p.run()
            except RuntimeError as e:
                row[f"run{i}_error"] = _described(str(e))
                break
            if i == 0:
                images = out.as_cpu() if device == "gpu" else out
                a, b = np.asarray(images[0]).astype(np.int16), np.asarray(images[1]).astype(np.int16)
                row["mean_abs_diff_to_good"] = (float(np.abs(a - b).mean()) if a.shape == b.shape
                                                else f"shape {b.shape} vs {a.shape}")
    else:
        raise ValueError(f"unknown config {config!r}")
    return row


def _run_one(args: tuple[str, str, str, str]) -> dict:
    import subprocess
    import sys

    named = dict(zip(("case", "config", "device", "photo"), args))
    cmd = [sys.executable, "-m", "benchmarks.probes.decode_failure_probe", "--one", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return {**named, "timed_out_s": 180}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    return {**named, "crashed": done.returncode, "stderr_tail": done.stderr.splitlines()[-6:]}


def probe(devices: list[str], *, jobs: int) -> dict:
    """Every (case, config, device, photo), each in its own process, ``jobs`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    from crossdali.common.data.check.images import inspect_image

    result: dict = {"fast_pass": {}, "rows": []}
    for photo in PHOTOS:
        result["fast_pass"][photo] = {name: [list(p) for p in inspect_image(data, extension=".jpg").problems]
                                      for name, data in cases(_photo(photo)).items()}
    todo = [(name, config, device, photo) for photo in PHOTOS for name in result["fast_pass"][photo]
            for device in devices for config in CONFIGS]
    with ThreadPoolExecutor(jobs) as pool:
        for row in pool.map(_run_one, todo):
            result["rows"].append(row)
            print(json.dumps(row)[:400], flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--devices", default="cpu,gpu", help="comma-separated: cpu, gpu")
    parser.add_argument("--jobs", type=int, default=6, help="rows run at once (each in its own process)")
    parser.add_argument("--one", nargs=4, metavar=("CASE", "CONFIG", "DEVICE", "PHOTO"),
                        help="one row, printed as JSON")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)), flush=True)
        return
    if args.out is None:
        parser.error("--out is required")
    result = probe([d for d in args.devices.split(",") if d], jobs=args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_failure_probe.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
