"""Fetch a loader's batches in a background thread, a bounded number ahead of the training step.

Why: TensorFlow's ``DALIDataset`` copies each GPU batch into TensorFlow's memory and then
synchronizes TensorFlow's compute stream, so its next() waits until the step already queued there
has finished. Fetched by the training loop, the next batch therefore costs the GPU an idle gap
every step; fetched by this thread, that wait happens beside the step instead of after it.

Written by hand: ``tf.data``'s ``prefetch`` would do it in C++, but DALI advises against applying
``tf.data`` transformations to a GPU-placed ``DALIDataset`` (they are CPU datasets), and no
maintained library offers a closable, exception-forwarding background iterator of this size.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_DONE = object()


class BackgroundIterator(Generic[T]):
    """``for x in BackgroundIterator(iterable, ahead=1)``: the items of ``iterable`` in their order,
    fetched by one daemon thread: at most ``ahead`` items wait for the consumer, and the thread
    fetches one more meanwhile.

    An exception raised by the iterable is raised by the consumer's ``next()``, after the items
    fetched before it. ``close()`` (also called when the iterable is exhausted) stops the thread and
    closes the iterable's iterator in that thread, so a generator's ``finally`` runs there; items
    fetched but not consumed are dropped, so close only where the rest of the stream is not wanted
    (an epoch left early by an error or a stop request).
    """

    def __init__(self, iterable: Iterable[T], *, ahead: int = 1) -> None:
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1, got {ahead}")
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()  # set by close(): the consumer wants no more
        self._thread = threading.Thread(target=self._run, args=(iterable,), name="crossdali-fetch",
                                        daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        """Queue ``item`` unless the consumer closed the iterator first; True if queued."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, iterable: Iterable[T]) -> None:
        it = None
        try:
            it = iter(iterable)
            for item in it:
                if not self._put((item, None)):
                    return
            self._put((_DONE, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            self._put((_DONE, e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> BackgroundIterator[T]:
        return self

    def __next__(self) -> T:
        if self._stop.is_set():
            raise StopIteration
        item, error = self._queue.get()
        if item is _DONE:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the thread (it finishes the item it is fetching) and wait for it."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def _in_this_thread(iterable: Iterable[T]) -> Iterator[T]:
    yield from iterable  # close() closes the iterable's iterator too


def fetch_ahead(iterable: Iterable[T], ahead: int) -> Iterator[T]:
    """The items of ``iterable``: fetched by the caller with ``ahead`` = 0, else by a ``BackgroundIterator``
    ``ahead`` items ahead. Either way the result has ``close()``."""
    return _in_this_thread(iterable) if ahead == 0 else BackgroundIterator(iterable, ahead=ahead)
