"""Inference preprocessing: a long-lived DALI pipeline with crossdali's val transform, fed whatever
encoded images arrive (1 to ``max_batch_size`` per run), plus a micro-batcher that groups
requests from many threads into such runs. ``choose_engine`` says whether a run goes through
that pipeline or through DALI's dynamic mode (``crossdali.common.eager``: the same operators called
one by one, no pipeline to build or feed, on the CPU only), which gives the same bits.

The transform is ``augment_classification(train=False)``, the very graph the val loaders run, so
a model sees at inference what it saw in validation (bit for bit on the CPU).

Formats: what DALI decodes (JPEG, PNG, BMP, TIFF, JPEG 2000, WebP, PNM) goes in unchanged. Anything
else that PIL can open (GIF above all: the format users trip over; also ICO, PSD, ...) is
**converted transparently** to lossless PNG of its first frame (logged once per input at INFO).
What PIL cannot open either is **refused** with the input's name. A corrupt file of a decodable
format fails DALI's decoder; the error then names the input too.
"""

from __future__ import annotations

import io
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from crossdali.common.classification import ClassificationTransform, augment_classification
from crossdali.common.data.sources import sniff_image_bytes
from crossdali.common.errors import DataError, UsageError
from crossdali.common.options import PipelineOptions

__all__ = ["EAGER_CPU_ONLY", "EAGER_MAX_IMAGES", "EAGER_STARTS_FASTER", "ENGINES", "EncodedImage", "InferencePipeline",
           "MicroBatcher", "check_engine", "choose_engine", "prepare_image", "preprocessing_error"]

log = logging.getLogger(__name__)

_INPUT = "encoded"

#: The two ways to run the val transform: DALI's dynamic mode (``crossdali.common.eager``, operators
#: called one by one on the request, CPU only) and the pipeline below (a graph built once); ``auto`` chooses.
ENGINES = ("auto", "eager", "pipeline")

#: ``auto``: runs of up to this many images take the eager engine, larger ones the pipeline. Per device,
#: where the latency benchmark (docs/benchmarks.md#inference) found eager no slower than the pipeline.
#: 0 on the GPU: the eager engine is CPU-only (``EAGER_CPU_ONLY``).
EAGER_MAX_IMAGES = {"cpu": 8, "gpu": 0}

#: Why ``engine="eager"`` is refused on a GPU: there the pipeline engine was as fast, and eager's GPU
#: decoder could differ from the val pipeline's pixels (docs/inference.md#eager-is-cpu-only).
EAGER_CPU_ONLY = ("--engine eager (engine='eager') runs on the CPU only: on a GPU the pipeline engine is as fast and "
                  "gives the val pipeline's pixels (docs/inference.md#eager-is-cpu-only); use --engine pipeline or "
                  "auto, or --device cpu")

#: Whether a new eager engine gives its first result sooner than a new pipeline (the latency benchmark's cold
#: start: eager's includes importing DALI's dynamic mode, the pipeline's its build). ``auto`` in a process that
#: serves one request (``crossdali predict``) takes eager only where it does.
EAGER_STARTS_FASTER = {"cpu": False, "gpu": False}


@dataclass(frozen=True)
class EncodedImage:
    """Bytes DALI can decode, with the name errors and results use (a path, or e.g. ``<stdin>``)."""

    name: str
    data: np.ndarray  # uint8, 1-D
    converted_from: str | None = None  # e.g. "a GIF file" when PIL re-encoded it


def prepare_image(data: bytes, *, name: str) -> EncodedImage:
    """``data`` ready for DALI: passed through when DALI decodes its format, converted to PNG when
    only PIL does (first frame, RGB), refused with ``name`` otherwise (``DataError``)."""
    problem = sniff_image_bytes(bytes(data[:16]))
    if problem is None:
        return EncodedImage(name, np.frombuffer(data, dtype=np.uint8))
    from PIL import Image, UnidentifiedImageError  # defer: only for formats DALI does not decode

    try:
        with Image.open(io.BytesIO(data)) as img:
            frames = getattr(img, "n_frames", 1)
            img.seek(0)
            rgb = img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as e:
        detail = "" if isinstance(e, UnidentifiedImageError) else f" ({e})"  # PIL's says only "cannot identify"
        raise DataError(f"{name} is {problem}, which neither DALI nor PIL can read as an image{detail}; "
                        "pass a JPEG, PNG, BMP, TIFF, WebP or GIF file") from None
    out = io.BytesIO()
    rgb.save(out, format="PNG", compress_level=1)  # lossless; level 1: fast to write, DALI decodes it alike
    log.info("%s is %s: converted to PNG for DALI%s", name, problem,
             f" (first of {frames} frames)" if frames > 1 else "")
    return EncodedImage(name, np.frombuffer(out.getvalue(), dtype=np.uint8), converted_from=problem)


def _pil_problem(image: EncodedImage) -> str | None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(image.data.tobytes())) as img:
            img.load()
    except UnidentifiedImageError:  # its message names the BytesIO object, not the image
        return "Pillow cannot identify it as an image"
    except Exception as e:  # noqa: BLE001 - any decoder failure is the answer we look for
        return f"{type(e).__name__}: {e}"
    return None


def preprocessing_error(images: Sequence[EncodedImage], error: Exception) -> DataError:
    """The ``DataError`` for DALI's failure to preprocess ``images``: it names the image PIL cannot
    decode either (DALI's own message names no input), else all of them with DALI's last line."""
    for im in images:
        problem = _pil_problem(im)
        if problem is not None:
            return DataError(f"{im.name} cannot be decoded ({problem}); re-encode or leave it out")
    return DataError(f"DALI could not preprocess {', '.join(im.name for im in images)}: "
                     f"{str(error).strip().splitlines()[-1]}")


def check_engine(engine: str, *, device: str) -> None:
    """``ValueError`` for an unknown ``engine``; ``UsageError`` for ``"eager"`` on ``device="gpu"``
    (``EAGER_CPU_ONLY``). Touches no GPU: callers check before any CUDA work."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "eager" and device != "cpu":
        raise UsageError(EAGER_CPU_ONLY)


def choose_engine(engine: str, num_images: int, *, device: str, one_shot: bool = False) -> str:
    """``"eager"`` or ``"pipeline"``: which engine preprocesses a run of ``num_images`` on ``device``
    (``"cpu"`` or ``"gpu"``). ``"eager"`` and ``"pipeline"`` are taken as they are (``"eager"`` on the
    CPU only: ``check_engine``). ``"auto"`` picks eager for runs of up to ``EAGER_MAX_IMAGES[device]``
    images and the pipeline for larger ones; for a ``one_shot`` run (the only one of its process, so the
    engine's start-up counts) eager only where it also starts faster (``EAGER_STARTS_FASTER[device]``)."""
    check_engine(engine, device=device)
    if engine != "auto":
        return engine
    if num_images > EAGER_MAX_IMAGES[device] or (one_shot and not EAGER_STARTS_FASTER[device]):
        return "pipeline"
    return "eager"


class InferencePipeline:
    """DALI's val transform over batches of 1 to ``max_batch_size`` encoded images, built once.

    ``options`` says where it runs (``device="gpu"``: mixed decoder, outputs on the GPU) and its
    threads; its ``batch_size`` is the largest batch. ``run(images)`` returns DALI's output
    ``TensorList`` (N, C, H, W) for the framework wrapper to convert. One pipeline serves one
    thread at a time; ``MicroBatcher`` serialises many callers onto it.
    """

    def __init__(self, *, options: PipelineOptions, transform: ClassificationTransform | None = None) -> None:
        self.options, self.transform = options, transform or ClassificationTransform()
        self.max_batch_size = options.batch_size
        self._pipe = self._build()

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types  # defer: keeps `import crossdali.common` light

        kwargs = {**self.options.pipeline_kwargs(), "prefetch_queue_depth": 1}  # a request is never run ahead

        @pipeline_def(**kwargs)
        def inference_pipeline():
            encoded = fn.external_source(name=_INPUT, dtype=types.UINT8, ndim=1)
            return augment_classification(encoded, train=False, options=self.options, transform=self.transform)

        pipe = inference_pipeline()
        pipe.build()
        return pipe

    def run(self, images: Sequence[EncodedImage]):
        """The val transform of ``images`` (at most ``max_batch_size``), as a DALI ``TensorList``."""
        if not 1 <= len(images) <= self.max_batch_size:
            raise ValueError(f"a run takes 1 to {self.max_batch_size} images, got {len(images)}")
        try:
            self._pipe.feed_input(_INPUT, [im.data for im in images])
            (out,) = self._pipe.run()
            return out
        except RuntimeError as e:
            self._pipe = self._build()  # a failed run leaves DALI's executor in an error state
            raise preprocessing_error(images, e) from e


class MicroBatcher:
    """Groups requests from any number of threads into batches: whatever has arrived, up to
    ``max_batch_size``, goes to ``run_batch`` together (after the first request, it waits up to
    ``max_wait_s`` for more). ``submit(item)`` returns a ``Future`` with that item's result;
    ``run_batch(items) -> results`` runs in one background thread; when it raises for a batch, the
    batch's items are run one by one, so only the failing request gets the error. ``batches``
    counts the successful calls.
    """

    def __init__(self, run_batch: Callable[[list], Sequence], *, max_batch_size: int, max_wait_s: float = 0.0) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be positive, got {max_batch_size}")
        self.run_batch, self.max_batch_size, self.max_wait_s = run_batch, max_batch_size, max_wait_s
        self.batches = 0
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="crossdali-microbatcher", daemon=True)
        self._thread.start()

    def submit(self, item) -> Future:
        if self._closed:
            raise RuntimeError("this MicroBatcher is closed")
        future: Future = Future()
        self._queue.put((item, future))
        return future

    def close(self) -> None:
        """Finish what was submitted, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> MicroBatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _take(self) -> tuple[list, bool]:
        first = self._queue.get()
        if first is None:
            return [], True
        batch, stop = [first], False
        while len(batch) < self.max_batch_size:
            try:
                nxt = self._queue.get(timeout=self.max_wait_s) if self.max_wait_s > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                stop = True
                break
            batch.append(nxt)
        return batch, stop

    def _loop(self) -> None:
        stop = False
        while not stop:
            batch, stop = self._take()
            if not batch:
                continue
            self._run(batch)

    def _run(self, batch: list) -> None:
        try:
            results = self.run_batch([item for item, _ in batch])
            self.batches += 1
        except Exception as e:  # noqa: BLE001 - handed to the caller(s) it belongs to
            if len(batch) == 1:
                batch[0][1].set_exception(e)
            else:  # one bad request must not fail the others: run them one by one
                for one in batch:
                    self._run([one])
            return
        for (_, future), result in zip(batch, results):
            future.set_result(result)
