"""Does building DALI's GPU decoder hold the GIL? A Python thread counts while the main thread builds
the data checker's full-pass decoder (``mixed``); the share of its free rate it kept is printed.

    python -m benchmarks.probes.dali_build_gil          # GPU only

Why it matters: ``crossdali check --depth full`` reads image headers while that ~2 s build runs only
if the build lets Python threads run. What it found is in docs/data-checks.md.
"""

from __future__ import annotations

import threading
import time

from benchmarks import usage_error


def share_while_building(repeats: int = 2) -> list[tuple[float, float]]:
    """(build seconds, the counting thread's rate during the build / its free rate) per build."""
    from crossdali.common.data.check.decode import _PipelinedDecoder

    rows = []
    for _ in range(repeats):
        count, stop = [0], threading.Event()

        def spin(count: list[int] = count, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                count[0] += 1

        thread = threading.Thread(target=spin)
        thread.start()
        time.sleep(0.3)
        before, start = count[0], time.perf_counter()
        _PipelinedDecoder(device="gpu", batch_size=64, threads=16, source="paths").build()
        build, during = time.perf_counter() - start, count[0] - before
        before, start = count[0], time.perf_counter()
        time.sleep(0.5)
        free_rate = (count[0] - before) / (time.perf_counter() - start)
        stop.set()
        thread.join()
        rows.append((build, during / build / free_rate))
    return rows


def main() -> None:
    from crossdali.common.data.check.decode import gpu_available

    if not gpu_available():
        raise usage_error("no CUDA GPU here: this measures DALI's GPU decoder build")
    for build, share in share_while_building():
        print(f"build {build:.2f} s; the other thread ran {share:.0%} of its free rate meanwhile")


if __name__ == "__main__":
    main()
