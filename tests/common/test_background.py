"""The background fetcher the TensorFlow script uses for ``--fetch-ahead``: order, bound, errors, close."""

from __future__ import annotations

import threading
import time

import pytest

from crossdali.common.loading.background import BackgroundIterator, fetch_ahead


class Counted:
    """A generator over ``range(n)`` that counts what was taken from it, in which thread, and whether
    its ``finally`` ran (as a loader's epoch generator does)."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.taken, self.threads, self.closed = 0, set(), threading.Event()

    def __iter__(self):
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise KeyError(f"sample {i} is damaged")
                self.taken += 1
                self.threads.add(threading.current_thread().name)
                yield i
        finally:
            self.closed.set()


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("ahead", [1, 3])
def test_every_item_in_order_fetched_by_the_thread_a_bounded_number_ahead(ahead):
    source = Counted(20)
    it = BackgroundIterator(source, ahead=ahead)
    assert next(it) == 0
    # the thread fills the queue (ahead items) and fetches one more, then waits for the consumer
    assert _wait_for(lambda: source.taken == 1 + ahead + 1)
    time.sleep(0.2)
    assert source.taken == 1 + ahead + 1
    assert [next(it) for _ in range(4)] == [1, 2, 3, 4]
    assert list(it) == list(range(5, 20))
    assert source.threads == {"crossdali-fetch"} and source.closed.is_set()
    assert list(it) == []  # exhausted stays exhausted


def test_an_error_arrives_after_the_items_before_it_with_its_message():
    it = BackgroundIterator(Counted(10, fail_at=3), ahead=2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="sample 3 is damaged"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_an_iterable_that_cannot_start_raises_in_the_consumer():
    class Broken:
        def __iter__(self):
            raise OSError("shard list unreadable")

    with pytest.raises(OSError, match="shard list unreadable"):
        next(BackgroundIterator(Broken()))


def test_close_stops_the_thread_and_runs_the_generators_finally():
    source = Counted(1000)
    it = BackgroundIterator(source, ahead=1)
    assert next(it) == 0
    it.close()
    assert source.closed.is_set() and source.taken <= 3  # not drained: the rest was not wanted
    assert not it._thread.is_alive()


def test_ahead_zero_fetches_in_the_callers_thread_and_closes_alike():
    source = Counted(5)
    it = fetch_ahead(source, 0)
    assert next(it) == 0 and source.threads == {threading.current_thread().name}
    it.close()
    assert source.closed.is_set()
    assert isinstance(fetch_ahead(Counted(2), 2), BackgroundIterator)
    with pytest.raises(ValueError, match="ahead must be at least 1, got 0"):
        BackgroundIterator([], ahead=0)
