"""Progress of a training epoch for people: a live bar with ETA on a terminal (tqdm), a plain log
line with ETA every ``print_freq`` steps when the output goes to a file (Slurm logs, CI), nothing
on ranks other than 0. Framework-free: every train script feeds it the same numbers."""

from __future__ import annotations

import logging
import sys
import time
from typing import IO

__all__ = ["EpochProgress", "format_duration"]

log = logging.getLogger("crossdali.progress")


def format_duration(seconds: float) -> str:
    """``1:02:03`` / ``2:03``: what people read in an ETA."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class EpochProgress:
    """One epoch's progress. ``update`` after every step with that step's numbers.

    ``bar``: None picks the bar when ``stream`` is a terminal and tqdm is installed (redrawn at most
    every ``refresh_seconds``); the ETA is the remaining steps times the mean step time so far.
    """

    def __init__(self, *, total: int, desc: str, initial: int = 0, enabled: bool = True, print_freq: int = 10,
                 unit: str = "img", bar: bool | None = None, stream: IO[str] | None = None,
                 refresh_seconds: float = 0.5) -> None:
        self.total, self.desc, self.done, self.unit = total, desc, initial, unit
        self.enabled, self.print_freq = enabled, print_freq
        self._start = time.perf_counter()
        self._steps = self._samples = 0
        self._wait = self._busy = 0.0
        self._bar = None
        stream = stream if stream is not None else sys.stderr
        if enabled and (bar or (bar is None and _isatty(stream))):
            try:
                from tqdm import tqdm  # defer: only a terminal needs it
            except ImportError:
                if bar:
                    raise ImportError("a progress bar needs tqdm: pip install tqdm") from None
            else:
                self._bar = tqdm(total=total, initial=initial, desc=desc, unit="step", file=stream, leave=False,
                                 dynamic_ncols=True, mininterval=refresh_seconds)

    @property
    def eta_seconds(self) -> float:
        mean = (time.perf_counter() - self._start) / max(self._steps, 1)
        return max(0, self.total - self.done) * mean

    def update(self, *, loss: float, lr: float, samples: int, step_seconds: float, data_wait_seconds: float) -> None:
        """One step done: its loss and lr, the samples it took (all ranks), its time and data wait."""
        self.done += 1
        self._steps += 1
        self._samples += samples
        self._busy += step_seconds
        self._wait += data_wait_seconds
        if not self.enabled:
            return
        rate = self._samples / max(self._busy, 1e-9)
        wait_pct = 100 * self._wait / max(self._busy, 1e-9)
        if self._bar is not None:
            self._bar.set_postfix_str(f"loss {loss:.4f} lr {lr:.3g} {rate:,.0f} {self.unit}/s data wait {wait_pct:.0f} %",
                                      refresh=False)
            self._bar.update(1)
        elif self.print_freq and self.done % self.print_freq == 0:
            log.info("%s step %d/%d  loss %.4f  lr %.4g  %s %s/s  data wait %.0f %%  eta %s", self.desc, self.done,
                     self.total, loss, lr, f"{rate:,.1f}", self.unit, wait_pct, format_duration(self.eta_seconds))
            self._samples, self._busy, self._wait = 0, 0.0, 0.0  # rates over the last print_freq steps

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
