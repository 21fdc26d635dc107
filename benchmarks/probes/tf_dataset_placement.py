"""Where ``loader.dataset`` hands its batches over on a GPU, and how fast, for candidate spellings.

    python -m benchmarks.probes.tf_dataset_placement [--size bench] [--out DIR]

Rows (same DALI pipeline, same JPEGs, one process): the loader's own iteration; the current
``.dataset`` (epoch bookkeeping as tf.data ops) iterated outside and inside a GPU device scope; the
bookkeeping ops built under the GPU scope; the current view plus ``prefetch_to_device``; the raw
DALIDataset (no bookkeeping, the ceiling); then ``model.fit`` of a tiny Keras model over some of them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import tensorflow as tf

from crossdali.tensorflow import enable_memory_growth  # isort: skip

enable_memory_growth()

from crossdali.common.data.sample_data import ensure_classification  # noqa: E402
from crossdali.common.data.sources import resolve_source  # noqa: E402
from crossdali.tensorflow import create_classification_loader  # noqa: E402
from crossdali.tensorflow.dali_loader import _planned  # noqa: E402


def _rate(it, steps: int, rounds: int = 3) -> tuple[float, str]:
    images = None
    for _ in range(steps):  # warm-up epoch
        images, _ = next(it)
    float(tf.reshape(images, [-1])[0])
    t0, n = time.perf_counter(), 0
    for _ in range(rounds * steps):
        images, _ = next(it)
        n += int(images.shape[0])
    float(tf.reshape(images, [-1])[0])
    return n / (time.perf_counter() - t0), images.device


def _fit_rate(ds, steps: int, shape) -> float:
    model = tf.keras.Sequential([tf.keras.Input(shape=shape[1:]), tf.keras.layers.GlobalAveragePooling2D(),
                                 tf.keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = []

    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            times.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            times[-1] = time.perf_counter() - times[-1]

    model.fit(ds, steps_per_epoch=steps, epochs=3, verbose=0, callbacks=[Timer()])
    return steps * shape[0] / min(times[1:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="bench")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path("/tmp/tf_dataset_placement"))
    args = p.parse_args()
    source = resolve_source(ensure_classification(None, size=args.size, formats=("imagefolder",)) / "imagefolder",
                            "train")
    make = lambda: create_classification_loader(source, train=True, backend="dali-gpu",  # noqa: E731
                                                batch_size=args.batch_size, workers=args.workers, device_id=0)
    rows = {}

    def row(name, fn):
        try:
            rows[name] = fn()
        except Exception as e:  # recorded, the other rows still run
            rows[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        print(name, rows[name], flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tf_dataset_placement.json").write_text(json.dumps(
            {"gpu": tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
                "device_name"), "tensorflow": tf.__version__, "batch_size": args.batch_size,
             "images": source.num_samples, "rows": rows}, indent=2) + "\n")

    def loader_iter():
        loader = make()

        def gen():
            while True:
                yield from loader
        r, d = _rate(gen(), loader.steps_per_epoch)
        return {"img_s": r, "device": d}

    def view(build_under_gpu: bool, iter_under_gpu: bool, prefetch: bool = False, raw: bool = False):
        def run():
            loader = make()
            if raw:
                ds = loader._raw
            elif build_under_gpu:
                with tf.device("/GPU:0"):
                    ds = _planned(loader._raw, loader.epochs, names=loader.names, flatten=loader.flatten)
            else:
                ds = loader.dataset
            if prefetch:
                ds = ds.apply(tf.data.experimental.prefetch_to_device("/GPU:0", 2))
            if iter_under_gpu:
                with tf.device("/GPU:0"):
                    it = iter(ds)
            else:
                it = iter(ds)
            r, d = _rate(it, loader.steps_per_epoch)
            return {"img_s": r, "device": d}
        return run

    def fit(kind: str):
        def run():
            loader = make()
            shape = (args.batch_size, 224, 224, 3)
            if kind == "raw":
                ds = loader._raw
            elif kind == "built_under_gpu":
                with tf.device("/GPU:0"):
                    ds = _planned(loader._raw, loader.epochs, names=loader.names, flatten=loader.flatten)
            elif kind == "prefetch":
                ds = loader.dataset.apply(tf.data.experimental.prefetch_to_device("/GPU:0", 2))
            else:
                ds = loader.dataset
            return {"img_s": _fit_rate(ds, loader.steps_per_epoch, shape)}
        return run

    row("loader iteration", loader_iter)
    row("dataset, iter outside", view(False, False))
    row("dataset, iter under GPU", view(False, True))
    row("dataset built under GPU, iter under GPU", view(True, True))
    row("dataset + prefetch_to_device", view(False, False, prefetch=True))
    row("raw DALIDataset, iter under GPU", view(False, True, raw=True))
    for kind in ("current", "built_under_gpu", "prefetch", "raw"):
        row(f"fit over {kind}", fit(kind))


if __name__ == "__main__":
    main()
