"""The next batches made on a thread while the device runs the current step.

On a GPU the step is queued and the host returns at once; what the host does next (collating
the next batch: slicing the token cache, padding, pinning) is then all that stands between two
steps. :class:`Prefetch` runs an iterator of batches on one background thread, ``depth`` items
ahead, so that work overlaps the device's. Collation is tensor and NumPy work that releases the
GIL for its copies, and the queue holds at most ``depth`` finished batches (bounded memory).

The items arrive in the iterator's order; an exception raised by the iterator is raised again,
as itself, by the ``next()`` that would have returned the item it failed on; :meth:`close` (or
leaving a ``with`` block, or the end of the items) stops the thread and closes the iterator.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

#: How often (seconds) a producer blocked on a full queue looks whether it was closed.
_POLL_S = 0.05


class _End:
    """The producer's last item: the end of the iterator, or the exception it raised."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class Prefetch(Generic[T]):
    """``Prefetch(batches, depth=2)``: iterate ``batches`` on a background thread, at most
    ``depth`` items ahead of the consumer.

    Args:
        batches: any iterable (a generator of collated batches); iterated on the thread only.
        depth: finished items kept ready (``>= 1``); with 2, the batch after next is being made
            while the next one waits.
    """

    def __init__(self, batches: Iterable[T], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"Prefetch depth must be >= 1, got {depth}")
        self._source = iter(batches)
        self._queue: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._produce, name="cselab-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(_End(err))
            return
        self._put(_End())

    def _put(self, item: T | _End) -> bool:
        """Queue ``item``, waiting for room; ``False`` once the consumer has closed."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _End):
            self.close()
            if item.error is not None:
                raise item.error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the thread (dropping what it made ahead) and close the iterator; idempotent."""
        self._done = True
        self._stop.set()
        self._thread.join()  # a producer waiting for room sees the stop within _POLL_S
        while not self._queue.empty():  # the batches made ahead: freed now
            self._queue.get_nowait()
        close = getattr(self._source, "close", None)
        if close is not None:  # a generator: run its ``finally`` blocks now, not at collection
            close()

    def __enter__(self) -> Prefetch[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
