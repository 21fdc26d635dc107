"""Image headers read by worker processes that never wait for the parent.

The full pass builds DALI's GPU decoder (about 2 s on the H100) while headers are read, and that
build holds the GIL (``python -m benchmarks.dali_build_gil``). A ``ProcessPoolExecutor`` needs the
parent's GIL to hand out work and take results back, so its workers stood idle through the build
and then shared the cores with DALI's decoding threads. Here each worker is given its share of the
files when it starts (blocks of ``BLOCK`` files, dealt round-robin so the first blocks finish
first) and writes each header as one fixed-size row into memory shared with the parent; only a
block's number goes through a queue when the block is done. A file with anything to report
(unreadable, unsupported, a problem, a format or mode not in the tables below) is marked for the
parent to inspect again itself, so the rows carry no text. Hand-written: no pool in the standard
library or elsewhere runs without the parent's interpreter.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
from collections.abc import Callable, Iterator, Sequence

from crossdali.common.check.images import DALI_FORMATS

__all__ = ["BLOCK", "inspect_in_processes"]

#: Files per block: a block is the unit a worker reports and the parent waits for.
BLOCK = 256
_FORMATS = sorted(DALI_FORMATS)
_MODES = ["1", "L", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LA", "PA", "I", "F", "I;16", "I;16B", "I;16L", "RGBX"]
_CLEAN, _ASK_PARENT = 1, 2
_FIELDS = 5  # status, format, width, height, mode


def _row(info: dict, readable: bool) -> tuple[int, int, int, int, int]:
    if (not readable or info["problems"] or info["format"] not in DALI_FORMATS or info["mode"] not in _MODES
            or not 0 <= info["width"] < 2**62 or not 0 <= info["height"] < 2**62):
        return _ASK_PARENT, 0, 0, 0, 0
    return _CLEAN, _FORMATS.index(info["format"]), info["width"], info["height"], _MODES.index(info["mode"])


def _work(inspect_one: Callable[[str], tuple[dict, bool]], paths: Sequence[str], rows, worker: int, workers: int,
          done) -> None:
    """In a worker: the header of every file of its blocks, a block number on ``done`` after each."""
    for block in range(worker, -(-len(paths) // BLOCK), workers):
        for i in range(block * BLOCK, min(len(paths), (block + 1) * BLOCK)):
            rows[i * _FIELDS:(i + 1) * _FIELDS] = _row(*inspect_one(paths[i]))
        done.put(block)
    done.close()
    done.join_thread()


def inspect_in_processes(paths: Sequence[str], processes: int,
                         inspect_one: Callable[[str], tuple[dict, bool]]) -> Iterator[tuple[dict, bool]]:
    """``inspect_one(path)`` of every path, in order, read by ``processes`` worker processes.

    ``inspect_one`` must be a module-level function (a spawned worker imports it). Workers are
    forked where the system can (a spawned one re-runs a user script that lacks the ``if __name__ ==
    "__main__"`` guard); the caller starts this before it builds any DALI pipeline, and
    ``crossdali.common.fork_safety`` keeps dead pipelines out of the children. A worker that dies
    leaves its blocks to the parent, which reads them itself.
    """
    if not paths:
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    rows = ctx.RawArray("q", len(paths) * _FIELDS)
    done = ctx.Queue()
    blocks = -(-len(paths) // BLOCK)
    processes = max(1, min(processes, blocks))
    workers = [ctx.Process(target=_work, args=(inspect_one, paths, rows, w, processes, done), daemon=True)
               for w in range(processes)]
    for w in workers:
        w.start()
    finished: set[int] = set()
    try:
        for block in range(blocks):
            while block not in finished:
                if workers[block % processes].exitcode is not None:  # ended: what it finished is queued
                    _drain(done, finished)
                    break
                try:
                    finished.add(done.get(timeout=1.0))
                except queue_module.Empty:
                    pass
            parent_reads = block not in finished
            for i in range(block * BLOCK, min(len(paths), (block + 1) * BLOCK)):
                status, fmt, width, height, mode = rows[i * _FIELDS:(i + 1) * _FIELDS]
                if parent_reads or status != _CLEAN:
                    yield inspect_one(paths[i])
                else:
                    yield {"format": _FORMATS[fmt], "width": width, "height": height, "mode": _MODES[mode],
                           "problems": []}, True
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
        for w in workers:
            w.join()
        done.close()
        done.cancel_join_thread()


def _drain(done, finished: set[int]) -> None:
    while True:
        try:
            finished.add(done.get_nowait())
        except queue_module.Empty:
            return
