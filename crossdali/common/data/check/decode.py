"""The full pass: decode every sample with DALI's own decoder and treat its warnings as errors.

DALI stops on an image it cannot decode (the pipeline is then unusable) and only prints a line on
stderr for a JPEG with corrupt data (libjpeg-turbo's "Corrupt JPEG data: premature end of data
segment", measured with DALI 2.4), then trains on the damaged pixels. So samples (or, for image
files, their names, read by ``fn.io.file.read``) are fed through ``external_source`` into
``fn.decoders.image`` (``mixed`` on a GPU, where training decodes there) in chunks (``CHUNK_SAMPLES``):
the batches of a chunk run pipelined (several in flight, as in a
loader), file descriptor 2 is captured around the chunk, and the pipeline is drained before the
next one. A chunk that fails or prints anything is decoded again one batch at a time, and a batch
that does so one sample at a time, to name the culprit. No pixels of a sample over the size limit
are ever allocated: the fast pass keeps those out.

On a GPU, image files whose headers were all read first go through DALI's file reader instead
(``decode_file_list``: the loader's way of reading, faster than ``fn.io.file.read`` there), with
descriptor 2 captured for the whole pass and suspects searched the same way afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

__all__ = ["NVIMGCODEC_STATUS", "capture_stderr", "decode_file_list", "decode_files", "decode_samples", "describe_dali_error",
           "gpu_available", "stderr_captured"]

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
#: Extra arguments of the ``mixed`` decoder (DALI's defaults when empty; benchmarks.check_speed sets
#: ``hw_decoder_load`` here and in its loader row to compare the two with the same decoder).
GPU_DECODER_ARGS: dict = {}
# Lines DALI or its libraries print that say nothing about a sample.
_HARMLESS = re.compile(r"^\s*$|DeprecationWarning|^\s*warnings\.warn")


def gpu_available() -> bool:
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:  # noqa: BLE001 - no driver, no GPU
        return False


class PrintedLines:
    """What has been written to a captured file descriptor 2 since the last look (``new_lines``)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.offset = fd, 0

    def new_lines(self) -> list[str]:
        sys.stderr.flush()
        size = os.fstat(self.fd).st_size
        data = os.pread(self.fd, size - self.offset, self.offset) if size > self.offset else b""
        self.offset += len(data)
        return [_clean(line) for line in data.decode("utf-8", "replace").splitlines() if not _HARMLESS.search(line)]


@contextlib.contextmanager
def stderr_captured() -> Iterator[PrintedLines]:
    """File descriptor 2 (where C/C++ code such as libjpeg writes its warnings) sent to a temporary
    file for the block; the yielded ``PrintedLines`` reads what arrived so far."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield PrintedLines(tmp.fileno())
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def capture_stderr() -> Iterator[list[str]]:
    """Capture what C/C++ code writes to file descriptor 2 (libjpeg's warnings) into the yielded list."""
    lines: list[str] = []
    with stderr_captured() as printed:
        try:
            yield lines
        finally:
            lines.extend(printed.new_lines())


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
    """One batch at a time, nothing in flight: slow, but a failure or a warning belongs to the batch."""

    def __init__(self, *, device: str, batch_size: int, threads: int, source: str = "bytes") -> None:
        self.device, self.batch_size, self.threads, self.source = device, batch_size, threads, source
        self.pipe = None

    def _pipeline_kwargs(self) -> dict:
        return {"prefetch_queue_depth": 1, "exec_async": False, "exec_pipelined": False}

    def _build(self) -> None:
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device == "gpu"

        @pipeline_def(batch_size=self.batch_size, num_threads=self.threads, device_id=0 if gpu else None,
                      **self._pipeline_kwargs())
        def decode():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            if self.source == "paths":  # UTF-8 file names in, read by DALI's threads
                encoded = fn.io.file.read(encoded)
            return fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                     **(GPU_DECODER_ARGS if gpu else {}))

        self.pipe = decode()
        self.pipe.build()

    def run(self, batch: list[np.ndarray] | np.ndarray) -> tuple[str | None, list[str]]:
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


class _PipelinedDecoder(_Decoder):
    """Several batches in flight (DALI's pipelined, asynchronous executor), drained per chunk.

    One synchronous batch at a time leaves the GPU decoder idle between batches, a small fraction of
    the loader's rate; a loader keeps ``prefetch_queue_depth`` batches in flight, so this does too.
    """

    def __init__(self, *, device: str, batch_size: int, threads: int, source: str = "bytes", depth: int = 2) -> None:
        super().__init__(device=device, batch_size=batch_size, threads=threads, source=source)
        self.depth = depth
        self.primed = False

    def _pipeline_kwargs(self) -> dict:
        return {"prefetch_queue_depth": self.depth}

    def build(self) -> None:
        self._build()
        self.primed = False

    def run_chunk(self, batches: Iterator[list[np.ndarray] | np.ndarray]) -> tuple[str | None, list[str]] | None:
        """(DALI's error or None, captured stderr lines) for the batches of one chunk; ``None`` when
        the chunk is too short to start the pipeline (its first run needs ``depth`` batches).

        ``batches`` is consumed lazily, one batch as each decoded one is released: the caller
        assembles the next batches (headers, names) while DALI decodes the earlier ones; collecting a
        whole chunk first would run the two one after the other. The caller's own errors are raised,
        not taken for DALI's.
        """
        source_error: list[BaseException] = []

        def pull() -> list[np.ndarray] | None:
            try:
                return next(batches, None)
            except BaseException as e:  # noqa: BLE001 - re-raised below, outside the capture
                source_error.append(e)
                return None

        head: list[list[np.ndarray]] = []
        if self.pipe is None or not self.primed:
            while len(head) < self.depth and not source_error and (batch := pull()) is not None:
                head.append(batch)
            if self.pipe is None and len(head) == self.depth:  # after the first samples: they started
                self.build()                                    # the caller's header workers
        if source_error:
            raise source_error[0]
        if not self.primed and len(head) < self.depth:
            return None
        in_flight = 0
        with capture_stderr() as lines:
            try:
                if not self.primed:  # the first schedule_run runs `depth` iterations
                    for batch in head:
                        self.pipe.feed_input("encoded", batch)
                    self.pipe.schedule_run()
                    self.primed, in_flight = True, self.depth
                while in_flight < self.depth and (batch := pull()) is not None:
                    self.pipe.feed_input("encoded", batch)
                    self.pipe.schedule_run()
                    in_flight += 1
                while in_flight:
                    self.pipe.share_outputs()
                    self.pipe.release_outputs()
                    in_flight -= 1
                    if (batch := pull()) is not None:
                        self.pipe.feed_input("encoded", batch)
                        self.pipe.schedule_run()
                        in_flight += 1
                error = None
            except RuntimeError as e:
                error = str(e)
        if error is not None:
            self.pipe, self.primed = None, False
        if source_error:
            raise source_error[0]
        return error, lines


#: Samples per chunk, per device: large enough that draining the pipeline between chunks costs
#: little, small enough that the progress bar moves every second or two (a GPU decodes tens of times
#: more JPEGs per second than a small CPU).
CHUNK_SAMPLES = {"cpu": 512, "gpu": 4096}
#: Batches in flight in the full pass, per device (as a loader's ``prefetch_queue_depth``).
PIPELINE_DEPTH = {"cpu": 2, "gpu": 2}


def decode_samples(samples: Iterable[tuple[str, bytes]], *, device: str = "cpu", batch_size: int = 32,
                   threads: int = 2, on_batch: Callable[[int], None] | None = None) -> dict[str, tuple[str, str]]:
    """``{key: (code, text)}`` for every sample DALI fails on (``decode-failed``) or warns about
    (``decoder-warning``); ``on_batch(n)`` is called after every ``n`` samples (a progress bar).

    ``samples`` is consumed lazily, a chunk at a time, so it may read files as it goes.
    """
    return _decode_stream(samples, source="bytes", device=device, batch_size=batch_size, threads=threads,
                          on_batch=on_batch)


def decode_files(paths: Iterable[str], *, device: str = "cpu", batch_size: int = 32, threads: int = 2,
                 on_batch: Callable[[int], None] | None = None) -> dict[str, tuple[str, str]]:
    """:func:`decode_samples` for image files, keyed by path: only the names pass through Python,
    DALI's threads read the files (``fn.io.file.read``). Reading the bytes in Python and feeding
    them holds the GIL, which a GPU's full pass cannot afford. ``paths`` is
    consumed lazily, so the caller may still be inspecting headers of later files."""
    return _decode_stream(((path, os.fsencode(path)) for path in paths), source="paths", device=device,
                          batch_size=batch_size, threads=threads, on_batch=on_batch)


def _names_batch(names: list[bytes]) -> np.ndarray:
    """File names as one dense ``uint8`` batch, each row padded with NUL bytes: ``fn.io.file.read``
    opens the name up to its first NUL (a POSIX name holds none), and one array is fed in one call
    where a list of 64 arrays costs DALI's ``feed_input`` about 1 ms of the main thread per batch
    (on a GPU the feed would be the full pass's largest own time)."""
    return np.array(names, dtype=bytes).view(np.uint8).reshape(len(names), -1)


def _chunk(samples: Iterator[tuple[str, bytes]], keys: list[list[str]], batches_out: list, *, batch_size: int,
           batches: int, state: dict, source: str) -> Iterator[list[np.ndarray] | np.ndarray]:
    """Up to ``batches`` batches read from ``samples`` as the decoder asks for them, each batch's keys
    appended to ``keys`` and the batch to ``batches_out``; ``state["exhausted"]`` once ``samples``
    ran out."""
    for _ in range(batches):
        taken = list(itertools.islice(samples, batch_size))
        state["exhausted"] = len(taken) < batch_size
        if taken:
            keys.append([key for key, _ in taken])
            if source == "paths":
                batch = _names_batch([data for _, data in taken])
            else:
                batch = [np.frombuffer(data, dtype=np.uint8) for _, data in taken]
            batches_out.append(batch)
            yield batch
        if state["exhausted"]:
            return


def _failure_text(error: str, lines: list[str]) -> str:
    """Why one sample failed: DALI's error says only "Failed to decode sample #0" for what
    libjpeg-turbo explains on stderr ("Bogus Huffman table definition"), so the decoder's own lines
    (the last three) are added."""
    text = describe_dali_error(error)
    if re.fullmatch(r"Failed to decode sample #\d+\s*:?", text):
        text = "DALI's decoder failed"
    said = list(dict.fromkeys(lines))[-3:]  # already cleaned by PrintedLines
    return f"{text} ({'; '.join(said)})" if said else text


def _search_batch(slow: _Decoder, keys: list[str], batch: list[np.ndarray] | np.ndarray,
                  bad: dict[str, tuple[str, str]]) -> None:
    """Decode one suspect batch alone, and if it fails or prints anything, each of its samples alone:
    the culprits go into ``bad``."""
    error, lines = slow.run(batch)
    if error is None and not lines:
        return
    for key, arr in zip(keys, batch):
        one_error, one_lines = slow.run([arr]) if len(keys) > 1 else (error, lines)
        if one_error is not None:
            bad[key] = ("decode-failed", _failure_text(one_error, one_lines))
        elif one_lines:
            bad[key] = ("decoder-warning", "DALI's decoder warned: " + "; ".join(dict.fromkeys(one_lines)))


def _decode_stream(samples: Iterable[tuple[str, bytes]], *, source: str, device: str, batch_size: int, threads: int,
                   on_batch: Callable[[int], None] | None) -> dict[str, tuple[str, str]]:
    fast = _PipelinedDecoder(device=device, batch_size=batch_size, threads=threads, source=source,
                             depth=PIPELINE_DEPTH[device])
    slow = _Decoder(device=device, batch_size=batch_size, threads=threads, source=source)
    bad: dict[str, tuple[str, str]] = {}

    samples = iter(samples)
    chunk_batches = max(2 * fast.depth, -(-CHUNK_SAMPLES[device] // batch_size))
    exhausted = False
    while not exhausted:
        keys: list[list[str]] = []
        batches: list = []
        state = {"exhausted": False}
        outcome = fast.run_chunk(_chunk(samples, keys, batches, batch_size=batch_size, batches=chunk_batches,
                                        state=state, source=source))
        exhausted = state["exhausted"]
        if not keys:
            break
        if outcome is None or outcome[0] is not None or outcome[1]:  # find the batch, then the sample
            for batch_keys, batch in zip(keys, batches):
                _search_batch(slow, batch_keys, batch, bad)
        if on_batch is not None:
            on_batch(sum(map(len, keys)))
    return bad


def decode_file_list(paths: Sequence[str], *, device: str = "cpu", batch_size: int = 32, threads: int = 2,
                     on_batch: Callable[[int], None] | None = None) -> dict[str, tuple[str, str]]:
    """:func:`decode_files` for a list known in full, read by DALI's file reader as the loader reads
    (``fn.readers.file``, no mmap): it feeds a GPU decoder faster than names fed to
    ``fn.io.file.read``, however they are fed (``python -m benchmarks.probes.dali_read_paths``).

    The reader runs ahead of what is fetched, so a window cannot be drained to pin a warning on it:
    file descriptor 2 stays captured for the whole pass (a progress bar must draw elsewhere: the
    command line's draws on its own copy of the terminal), and after each ``CHUNK_SAMPLES`` window
    the batches it fetched plus those DALI may already have started are suspects when anything was
    printed. Suspects are decoded again one batch, then one sample, at a time once the reader is
    gone. After a failure (the pipeline is then unusable) the rest goes through :func:`decode_files`.
    """
    paths = list(paths)
    if not paths:
        return {}
    depth = PIPELINE_DEPTH[device]
    batches = -(-len(paths) // batch_size)
    window = max(1, CHUNK_SAMPLES[device] // batch_size)
    ahead = depth + 2  # batches the executor may have started beyond the last one fetched, and a margin
    suspects: set[int] = set()
    fetched, failed = 0, False
    with stderr_captured() as printed:
        pipe = _reader_pipeline(paths, device=device, batch_size=batch_size, threads=threads, depth=depth)
        while fetched < batches and not failed:
            first = fetched
            try:
                for _ in range(min(window, batches - fetched)):
                    pipe.run()
                    fetched += 1
            except RuntimeError as e:
                failed = True
                log.debug("the file reader's pipeline failed after %d batches: %s", fetched, describe_dali_error(e))
            if failed or printed.new_lines():
                suspects.update(range(first, min(batches, fetched + ahead)))
            if on_batch is not None and fetched > first:
                on_batch(min(fetched * batch_size, len(paths)) - first * batch_size)
        del pipe  # its threads stop before anything else decodes or prints
    bad: dict[str, tuple[str, str]] = {}
    slow = _Decoder(device=device, batch_size=batch_size, threads=threads, source="paths")
    for b in sorted(suspects):
        keys = paths[b * batch_size:(b + 1) * batch_size]
        _search_batch(slow, keys, _names_batch([os.fsencode(k) for k in keys]), bad)
        if b >= fetched and on_batch is not None:
            on_batch(len(keys))
    if failed:
        rest = max(max(suspects) + 1, fetched) * batch_size
        bad.update(decode_files(paths[rest:], device=device, batch_size=batch_size, threads=threads,
                                on_batch=on_batch))
    return bad


def _reader_pipeline(paths: list[str], *, device: str, batch_size: int, threads: int, depth: int):
    """A built pipeline: ``paths`` in order through DALI's file reader and image decoder, the last batch
    padded (by repeating its last file)."""
    from nvidia.dali import fn, pipeline_def, types

    gpu = device == "gpu"

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0 if gpu else None,
                  prefetch_queue_depth=depth)
    def decode():
        encoded, _ = fn.readers.file(files=paths, dont_use_mmap=True, pad_last_batch=True, name="Reader")
        return fn.decoders.image(encoded, device="mixed" if gpu else "cpu", output_type=types.RGB,
                                 **(GPU_DECODER_ARGS if gpu else {}))

    pipe = decode()
    pipe.build()
    return pipe
