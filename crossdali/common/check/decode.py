"""The full pass: decode every sample with DALI's own decoder and treat its warnings as errors.

DALI stops on an image it cannot decode (the pipeline is then unusable) and only prints a line on
stderr for a JPEG with corrupt data (libjpeg-turbo's "Corrupt JPEG data: premature end of data
segment", measured with DALI 2.4), then trains on the damaged pixels. So samples are decoded in
batches fed through ``external_source`` into ``fn.decoders.image`` (``mixed`` on a GPU, where
training decodes there), one batch at a time with nothing prefetched, with file descriptor 2
captured around each run: a batch that fails or prints anything is decoded again sample by sample
to name the culprit. No pixels of a sample over the size limit are ever allocated: the fast pass
keeps those out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator

import numpy as np

__all__ = ["NVIMGCODEC_STATUS", "capture_stderr", "decode_samples", "describe_dali_error", "gpu_available"]

log = logging.getLogger(__name__)

#: nvImageCodec's status codes (nvimgcodec.h) as DALI 2.4 prints them: "nvImageCodec failure: '#4'".
NVIMGCODEC_STATUS = {
    3: "bad or truncated data (NVIMGCODEC_STATUS_BAD_CODESTREAM)",
    4: "a format or variant no decoder supports (NVIMGCODEC_STATUS_CODESTREAM_UNSUPPORTED)",
    5: "the decoder could not allocate memory (NVIMGCODEC_STATUS_ALLOCATOR_FAILURE)",
    6: "the decoder failed while running (NVIMGCODEC_STATUS_EXECUTION_FAILED)",
    13: "bad data (NVIMGCODEC_STATUS_EXTENSION_BAD_CODE_STREAM)",
    14: "a variant the decoder does not support (NVIMGCODEC_STATUS_EXTENSION_CODESTREAM_UNSUPPORTED)",
    19: "incomplete data (NVIMGCODEC_STATUS_EXTENSION_INCOMPLETE_BITSTREAM)",
}
# Lines DALI or its libraries print that say nothing about a sample.
_HARMLESS = re.compile(r"^\s*$|DeprecationWarning|^\s*warnings\.warn")


def gpu_available() -> bool:
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no GPU
        return False


@contextlib.contextmanager
def capture_stderr() -> Iterator[list[str]]:
    """Capture what C/C++ code writes to file descriptor 2 (libjpeg's warnings) into the yielded list."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace")
            lines.extend(_clean(line) for line in text.splitlines() if not _HARMLESS.search(line))


def _clean(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", line).strip()


def describe_dali_error(error: BaseException | str) -> str:
    """The informative line of a DALI error ("nvImageCodec failure: '#3'" explained), without the
    pipeline-definition traceback DALI repeats."""
    text = str(error)
    m = re.search(r"nvImageCodec failure: '#(\d+)'", text)
    if m:
        code = int(m.group(1))
        return f"DALI's decoder failed: {NVIMGCODEC_STATUS.get(code, 'status ' + str(code))} (nvImageCodec #{code})"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("Critical error", "Current pipeline", "Error in ", "which was used",
                                                     "File \"", "encountered:", "C++ context"))
            and not ln.startswith(("o = ", "j, ", "jpegs"))]
    return (keep[-1] if keep else (lines[-1] if lines else text)).rstrip(".")


class _Decoder:
    def __init__(self, *, device: str, batch_size: int, threads: int) -> None:
        self.device, self.batch_size, self.threads = device, batch_size, threads
        self.pipe = None

    def _build(self) -> None:
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device == "gpu"

        @pipeline_def(batch_size=self.batch_size, num_threads=self.threads, device_id=0 if gpu else None,
                      prefetch_queue_depth=1, exec_async=False, exec_pipelined=False)
        def decode():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            return fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB)

        self.pipe = decode()
        self.pipe.build()

    def run(self, batch: list[np.ndarray]) -> tuple[str | None, list[str]]:
        """(DALI's error or None, captured stderr lines) for one batch; a failed pipeline is dropped."""
        if self.pipe is None:
            self._build()
        with capture_stderr() as lines:
            try:
                self.pipe.feed_input("encoded", batch)
                self.pipe.run()
                error = None
            except RuntimeError as e:
                error = str(e)
        if error is not None:
            self.pipe = None  # "Current pipeline object is no longer valid"
        return error, lines


def decode_samples(samples: Iterable[tuple[str, bytes]], *, device: str = "cpu", batch_size: int = 32,
                   threads: int = 2, on_batch: Callable[[int], None] | None = None) -> dict[str, tuple[str, str]]:
    """``{key: (code, text)}`` for every sample DALI fails on (``decode-failed``) or warns about
    (``decoder-warning``); ``on_batch(n)`` is called after every ``n`` samples (a progress bar)."""
    decoder = _Decoder(device=device, batch_size=batch_size, threads=threads)
    bad: dict[str, tuple[str, str]] = {}

    def flush(keys: list[str], arrays: list[np.ndarray]) -> None:
        error, lines = decoder.run(arrays)
        if error is not None or lines:
            for key, arr in zip(keys, arrays):  # again one by one, to name the sample
                one_error, one_lines = decoder.run([arr]) if len(keys) > 1 else (error, lines)
                if one_error is not None:
                    bad[key] = ("decode-failed", describe_dali_error(one_error))
                elif one_lines:
                    bad[key] = ("decoder-warning", "DALI's decoder warned: " + "; ".join(dict.fromkeys(one_lines)))
        if on_batch is not None:
            on_batch(len(keys))

    keys: list[str] = []
    arrays: list[np.ndarray] = []
    for key, data in samples:
        keys.append(key)
        arrays.append(np.frombuffer(data, dtype=np.uint8))
        if len(keys) == batch_size:
            flush(keys, arrays)
            keys, arrays = [], []
    if keys:
        flush(keys, arrays)
    return bad
