"""``data.prefetch.Prefetch``: the items in order from a background thread, at most ``depth``
ahead, the iterator's exception raised in the consumer, and a clean stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from cselab.data.prefetch import Prefetch


class Source:
    """A generator of numbered batches that records how far it ran, on which thread, and
    whether it was closed."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.made: list[int] = []
        self.threads: set[int] = set()
        self.closed = False

    def __iter__(self) -> Iterator[torch.Tensor]:
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise KeyError(f"row {i}")
                self.threads.add(threading.get_ident())
                self.made.append(i)
                yield torch.full((2, 3), i)
        finally:
            self.closed = True


def wait_until(condition, timeout: float = 5.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_items_arrive_in_order_made_on_another_thread() -> None:
    source = Source(7)
    got = [int(batch[0, 0]) for batch in Prefetch(source, depth=2)]
    assert got == list(range(7))
    assert source.threads and threading.get_ident() not in source.threads
    assert source.closed


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_thread_runs_at_most_depth_items_ahead(depth: int) -> None:
    source = Source(50)
    with Prefetch(source, depth=depth) as batches:
        next(batches)
        # the queue is full (depth items) and the producer holds one more, waiting for room
        wait_until(lambda: len(source.made) == 1 + depth + 1)
        time.sleep(0.2)
        assert len(source.made) == 1 + depth + 1


def test_the_iterator_s_exception_is_raised_in_the_consumer_after_the_items_before_it() -> None:
    source = Source(10, fail_at=3)
    batches = Prefetch(source)
    assert [int(next(batches)[0, 0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="row 3"):
        next(batches)
    with pytest.raises(StopIteration):
        next(batches)
    assert source.closed


def test_close_stops_the_thread_and_closes_the_iterator() -> None:
    source = Source(1000)
    batches = Prefetch(source, depth=2)
    assert int(next(batches)[0, 0]) == 0
    batches.close()
    assert not batches._thread.is_alive()
    assert source.closed and len(source.made) < 10
    with pytest.raises(StopIteration):
        next(batches)
    batches.close()  # idempotent


def test_a_depth_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1, got 0"):
        Prefetch([], depth=0)
