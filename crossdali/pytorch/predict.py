"""``crossdali predict CHECKPOINT IMAGE...``: the top classes of images (files, or bytes on stdin)
for a classification checkpoint, preprocessed by DALI exactly as the val loader does.

    crossdali predict runs/classification/checkpoint_best.pth photo.jpg cat.gif
    cat photo.jpg | crossdali predict checkpoint_best.pth -          # bytes on stdin
    python -m crossdali.pytorch.predict checkpoint_best.pth *.jpg --topk 3 --json

A checkpoint is read with ``torch.load(weights_only=True)``: it must hold ``model`` (a state
dict), the run's config under ``config`` or ``args`` (at least ``arch``, ``crop_size``,
``num_classes``) and optionally ``class_names``; anything that needs unpickling is refused
(unpickling runs code from the file). GIFs and other formats DALI does not decode are converted
to PNG on the way in (``crossdali.common.inference``); files nothing can read are refused by name.

In a program, ``Predictor`` keeps the model and DALI's preprocessing alive: ``predict(images)``
for a list, ``submit(image)`` from any thread (requests that arrive together run as one batch).
Two engines give the same bits on the CPU: DALI's dynamic mode (eager operators, no pipeline) and a
pipeline built once. A ``Predictor`` on the CPU sends small runs to the first, larger ones to the
second; the command, which serves one request per process, also weighs each engine's start-up.
``--engine`` / ``engine=`` picks one (docs/inference.md#engines-eager-dalis-dynamic-mode-and-the-pipeline).
Eager is CPU-only: on a GPU the pipeline is as fast and gives the val pipeline's pixels
(docs/inference.md#eager-is-cpu-only).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import pickle
import re
import sys
import threading
import zipfile
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from crossdali.common.classification import ClassificationTransform
from crossdali.common.errors import DataError
from crossdali.common.inference import (
    EAGER_MAX_IMAGES,
    EAGER_STARTS_FASTER,
    ENGINES,
    EncodedImage,
    InferencePipeline,
    MicroBatcher,
    check_engine,
    choose_engine,
    prepare_image,
    preprocessing_error,
)
from crossdali.common.models import ModelNameError
from crossdali.common.options import PipelineOptions
from crossdali.pytorch.models import create_model

__all__ = ["CheckpointError", "Prediction", "Predictor", "get_args_parser", "load_inference_checkpoint", "main", "run"]

log = logging.getLogger(__name__)

REQUIRED_CONFIG = ("arch", "crop_size", "num_classes")


class CheckpointError(ValueError):
    """The checkpoint is missing, not loadable without unpickling, or lacks what inference needs."""


def load_inference_checkpoint(path: str | Path, *, map_location: str | torch.device = "cpu"
                              ) -> tuple[torch.nn.Module, dict, list[str]]:
    """``(model in eval mode, config, class_names)`` from a training checkpoint, without unpickling.

    ``config`` comes from the checkpoint's ``config`` or ``args`` dict; ``class_names`` from
    ``class_names`` or, when absent, the class indices as strings.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":  # a zip's start without its central directory: cut short
                raise CheckpointError(f"{path} is truncated: a PyTorch checkpoint whose end is missing (a copy or a "
                                      "write that stopped early); use another checkpoint of the run, or copy it again")
        raise CheckpointError(f"{path} is not a PyTorch checkpoint (torch.save's zip format)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL (\S+)", str(e))
        raise CheckpointError(
            f"{path} holds pickled Python objects ({found.group(1) if found else 'not plain values'}), so it cannot "
            "be read with torch.load(weights_only=True). Loading it would run code from the file, so "
            "crossdali predict does not; re-save it with plain values: torch.save({'model': model.state_dict(), "
            "'config': {'arch': ..., 'crop_size': ..., 'num_classes': ...}, 'class_names': [...]}, path)") from None
    except Exception as e:  # noqa: BLE001 - a damaged file fails inside torch.load in many ways (zip, pickle, UTF-8)
        first = str(e).strip().split(". ")[0].splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"{path} is damaged or not a PyTorch checkpoint torch.load can read "
                              f"({type(e).__name__}{': ' + first[:160] if first else ''}); use another checkpoint "
                              "of the run, e.g. checkpoint_best.pth or checkpoint_last.pth") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        keys = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{path} has no 'model' state dict (it holds {keys}); expected the keys model, "
                              "config (or args) and class_names that the crossdali training scripts save")
    config = ckpt.get("config", ckpt.get("args"))
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} has no 'config' or 'args' dict with {', '.join(REQUIRED_CONFIG)}")
    # the training scripts keep arch and num_classes at the top level too; a run without --num-classes has
    # config num_classes None in checkpoints written before the resolved number went into the config
    config = {**config, **{k: ckpt[k] for k in ("arch", "num_classes") if config.get(k) is None and k in ckpt}}
    missing = [k for k in REQUIRED_CONFIG if config.get(k) is None]
    if missing:
        raise CheckpointError(f"{path}: the run's config lacks {', '.join(missing)}; inference needs "
                              f"{', '.join(REQUIRED_CONFIG)}")
    num_classes = int(config["num_classes"])
    names = ckpt.get("class_names")
    class_names = [str(n) for n in names] if names else [str(i) for i in range(num_classes)]
    if len(class_names) != num_classes:
        raise CheckpointError(f"{path}: {len(class_names)} class_names for num_classes={num_classes}")
    try:
        model = create_model(config["arch"], num_classes=num_classes)
    except ModelNameError as e:
        raise CheckpointError(f"{path}: the run's arch: {e}") from None
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: the weights do not fit {config['arch']} with {num_classes} classes: "
                              f"{str(e).splitlines()[0]}") from None
    return model.eval(), config, class_names


@dataclass(frozen=True)
class Prediction:
    """The top classes of one image: ``top`` is ``[(class name, class index, probability), ...]``."""

    image: str
    top: list[tuple[str, int, float]]
    converted_from: str | None = None

    @property
    def label(self) -> str:
        return self.top[0][0]


def _encoded(item: str | Path | bytes | EncodedImage, index: int) -> EncodedImage:
    if isinstance(item, EncodedImage):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return prepare_image(bytes(item), name=f"<bytes #{index}>")
    path = Path(item)
    if not path.is_file():
        raise DataError(f"image {path} does not exist")
    return prepare_image(path.read_bytes(), name=str(path))


class Predictor:
    """A model and DALI's val transform (DALI's GPU decoder when the model runs on CUDA), by two
    engines that give the same bits: DALI's dynamic mode (``crossdali.common.eager``, operators
    called on each run, CPU only) and a long-lived pipeline (``InferencePipeline``, built on first use).
    ``predict`` runs lists in batches of up to ``max_batch_size``; ``submit`` queues one image
    from any thread and batches whatever is waiting. ``Predictor.from_checkpoint(path)`` builds
    one from a training run's checkpoint.

    Args:
        model: the classifier; moved to ``device`` (a copy, if its weights live on another device).
        crop_size: side of the square images the model takes.
        class_names: the name of each output class, in order.
        resize_size: shorter side before the centre crop (default: the val transform's, from
            ``crop_size``).
        device: where the model runs (default: the current CUDA GPU if there is one, else the CPU).
        max_batch_size: the most images per model call.
        workers: DALI's threads.
        engine: ``"auto"`` (on the CPU eager for runs of up to ``EAGER_MAX_IMAGES`` images, the
            pipeline for larger ones: docs/benchmarks.md#inference; on CUDA the pipeline), ``"eager"``
            (CPU only: a ``UsageError`` on CUDA, raised before any CUDA work; docs/inference.md#eager-is-cpu-only)
            or ``"pipeline"``.
    """

    def __init__(self, model: torch.nn.Module, *, crop_size: int, class_names: Sequence[str],
                 resize_size: int | None = None, device: str | torch.device | None = None,
                 max_batch_size: int = 64, workers: int = 2, engine: str = "auto") -> None:
        self.device = torch.device(device) if device is not None else \
            torch.device("cuda" if torch.cuda.is_available() else "cpu")
        check_engine(engine, device="gpu" if self.device.type == "cuda" else "cpu")  # before any CUDA work
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        gpu = self.device.type == "cuda"
        self.options = PipelineOptions(batch_size=max_batch_size, device="gpu" if gpu else "cpu",
                                       device_id=self.device.index if gpu else None, num_threads=max(1, workers))
        self.transform = ClassificationTransform(crop_size=crop_size, resize_size=resize_size)
        self.engine = engine
        self._pipeline: InferencePipeline | None = None  # each engine is made on its first run
        self._eager = None
        first = next(model.parameters(), None)
        if first is not None and first.device != self.device:
            # .to() moves a module in place: a model shared with another Predictor (or the caller's own
            # code) on another device would be moved under it (a CPU Predictor built after a CUDA one
            # would pull the shared weights back to the CPU)
            model = copy.deepcopy(model)
        self.model = model.to(self.device).eval()
        self.class_names, self.max_batch_size = list(class_names), max_batch_size
        self._lock = threading.Lock()  # one DALI pipeline: one batch at a time
        self._batcher: MicroBatcher | None = None

    @classmethod
    def from_checkpoint(cls, path: str | Path, **kwargs) -> Predictor:
        model, config, class_names = load_inference_checkpoint(path)
        return cls(model, crop_size=int(config["crop_size"]), class_names=class_names,
                   resize_size=config.get("resize_size"), **kwargs)

    @property
    def pipeline(self) -> InferencePipeline:
        """The pipeline engine, built on first use (``batch_size`` = ``max_batch_size``)."""
        if self._pipeline is None:
            self._pipeline = InferencePipeline(options=self.options, transform=self.transform)
        return self._pipeline

    @property
    def eager(self):
        """The eager engine (``crossdali.common.eager.EagerPreprocessor``, CPU only), made on first use."""
        if self._eager is None:
            from crossdali.common.eager import EagerPreprocessor  # defer: imports DALI's dynamic mode

            self._eager = EagerPreprocessor(options=self.options, transform=self.transform)
        return self._eager

    def engine_for(self, num_images: int) -> str:
        """``"eager"`` or ``"pipeline"``: the engine that preprocesses a run of ``num_images``."""
        return choose_engine(self.engine, num_images, device=self.options.device)

    def preprocess(self, images: Sequence[EncodedImage]) -> torch.Tensor:
        """DALI's val transform of ``images`` as a float NCHW tensor on the model's device."""
        from nvidia.dali.plugin.pytorch import feed_ndarray  # defer: DALI's torch plugin

        with self._lock:
            if self.engine_for(len(images)) == "eager":
                if len(images) > self.max_batch_size:
                    raise ValueError(f"a run takes 1 to {self.max_batch_size} images, got {len(images)}")
                try:
                    # converted inside the eager context: DLPack, DALI's buffer, no copy
                    return self.eager.run(images, convert=lambda batch: batch.torch())
                except RuntimeError as e:
                    raise preprocessing_error(images, e) from e
            out = self.pipeline.run(images).as_tensor()
            batch = torch.empty(out.shape(), dtype=torch.float32, device=self.device)
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            feed_ndarray(out, batch, cuda_stream=stream)
        return batch

    @torch.inference_mode()
    def probabilities(self, images: Sequence[EncodedImage]) -> torch.Tensor:
        """Softmax over the classes, (N, num_classes), on the CPU."""
        return torch.softmax(self.model(self.preprocess(images)).float(), dim=1).cpu()

    def _predictions(self, images: Sequence[EncodedImage], topk: int) -> list[Prediction]:
        probs = self.probabilities(images)
        values, indices = probs.topk(min(topk, probs.shape[1]), dim=1)
        return [Prediction(im.name, [(self.class_names[i], i, p) for p, i in zip(v.tolist(), ix.tolist())],
                           im.converted_from)
                for im, v, ix in zip(images, values, indices)]

    def predict(self, images: Sequence[str | Path | bytes | EncodedImage], *, topk: int = 5) -> list[Prediction]:
        """Top-``topk`` classes of each image (paths, encoded bytes or ``EncodedImage``), in order."""
        encoded = [_encoded(item, i) for i, item in enumerate(images)]
        out: list[Prediction] = []
        for start in range(0, len(encoded), self.max_batch_size):
            out += self._predictions(encoded[start:start + self.max_batch_size], topk)
        return out

    def submit(self, image: str | Path | bytes | EncodedImage, *, topk: int = 5) -> Future:
        """A ``Future`` of the image's ``Prediction``; requests waiting together run as one batch."""
        if self._batcher is None:
            self._batcher = MicroBatcher(self._serve, max_batch_size=self.max_batch_size)
        return self._batcher.submit((_encoded(image, 0), topk))

    def _serve(self, requests: list[tuple[EncodedImage, int]]) -> list[Prediction]:
        """One batch of ``submit`` requests, each cut to its own ``topk``."""
        predictions = self._predictions([image for image, _ in requests], max(k for _, k in requests))
        return [Prediction(p.image, p.top[:k], p.converted_from) for p, (_, k) in zip(predictions, requests)]

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None


def _auto_engine_help() -> str:
    """What ``--engine auto`` does for one command, from the constants the latency benchmark sets."""
    if not EAGER_STARTS_FASTER["cpu"]:
        return ("auto (default): the pipeline, since for one command its build takes less time than eager's start "
                "(importing DALI's dynamic mode); a Predictor kept in a program on the CPU takes eager for small runs")
    return (f"auto (default): eager on the CPU for up to {EAGER_MAX_IMAGES['cpu']} images, where it starts faster "
            "than the pipeline builds, else the pipeline")


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, add_help=add_help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="training checkpoint (model, config/args, class_names)")
    parser.add_argument("images", nargs="+", help="image files; '-' reads one image's bytes from stdin")
    parser.add_argument("--topk", type=int, default=5, help="classes to print per image")
    parser.add_argument("-b", "--batch-size", type=int, default=64, help="largest batch sent through DALI and the model")
    parser.add_argument("-j", "--workers", type=int, default=2, help="DALI CPU threads")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="auto: CUDA (and DALI's GPU decoder) when a GPU is visible")
    parser.add_argument("--engine", default="auto", choices=ENGINES,
                        help="how DALI preprocesses (both give the same bits on the CPU): 'eager' calls its operators "
                             "directly (dynamic mode, no pipeline; CPU only: on a GPU the pipeline is as fast and "
                             "gives the val pipeline's pixels, docs/inference.md#eager-is-cpu-only), 'pipeline' "
                             f"builds a pipeline and runs it. {_auto_engine_help()} (docs/benchmarks.md#inference)")
    parser.add_argument("--json", action="store_true", help="one JSON object per image instead of text")
    return parser


def main(args: argparse.Namespace) -> list[Prediction]:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.topk < 1:
        raise ValueError(f"--topk must be positive, got {args.topk}")
    if args.images.count("-") > 1:
        raise ValueError("'-' (stdin) can be given once: stdin holds one image")
    check_engine(args.engine, device="gpu" if args.device == "cuda" else "cpu")  # before stdin and CUDA
    images = [prepare_image(sys.stdin.buffer.read(), name="<stdin>") if item == "-" else item for item in args.images]
    device = None if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is visible; use --device cpu")
    on_gpu = device == "cuda" or (device is None and torch.cuda.is_available())
    # one process, one request: the engine's start-up counts (crossdali.common.inference.choose_engine)
    engine = choose_engine(args.engine, len(images), device="gpu" if on_gpu else "cpu", one_shot=True)
    predictor = Predictor.from_checkpoint(args.checkpoint, device=device, max_batch_size=args.batch_size,
                                          workers=args.workers, engine=engine)
    predictions = predictor.predict(images, topk=args.topk)
    for p in predictions:
        if args.json:
            print(json.dumps({"image": p.image, "converted_from": p.converted_from,
                              "top": [{"class": c, "index": i, "probability": round(q, 6)} for c, i, q in p.top]}))
        else:
            print(f"{p.image}: " + ", ".join(f"{c} {100 * q:.1f}%" for c, _, q in p.top))
    return predictions


def run(argv: list[str] | None = None) -> int:
    """``main`` for the command line: a user's mistake prints one line and exits 2."""
    args = get_args_parser().parse_args(argv)
    try:
        main(args)
    except (CheckpointError, DataError, ValueError) as e:
        print(f"crossdali predict: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run())
