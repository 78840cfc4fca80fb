"""The bounded decode pool: a fixed number of worker threads over the shared models, a bounded queue behind them.

A request takes a slot before its upload is read (``DecodePool.reserve``): when every worker is busy and the
queue is full it is refused at once (503 with Retry-After), so neither memory nor the spool directory grows with
the number of waiting clients. Each job carries a cancel flag; ``transcribe()`` calls its ``progress`` callback
after each window, and the job's callback raises there once the client has gone, so a disconnected client's
work stops at the next window.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..runtime.executors import release_freed_memory


class Cancelled(Exception):
    """Raised from a job's progress callback once its client has disconnected."""


class QueueFull(Exception):
    """Every worker is busy and the queue behind them is full."""


@dataclass
class Job:
    """One request's decode: its cancel flag and the callbacks that run on the worker thread."""

    cancel: threading.Event = field(default_factory=threading.Event)

    def check(self, *_progress: Any) -> None:
        """``transcribe()``'s progress callback: stops the decode at this window once cancelled."""
        if self.cancel.is_set():
            raise Cancelled


class Slot:
    """A reserved place in the pool (a worker or the queue); released when the request ends, however it ends."""

    def __init__(self, pool: DecodePool):
        self._pool = pool
        self._released = False
        self.job = Job()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool.free_slot()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(job, *args)`` on a worker; a cancelled await (the client went away) cancels the job."""
        future = self._pool.submit(self.job, fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.job.cancel.set()
            raise

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.job.cancel.set()  # a request that ends while its job still runs (an error elsewhere) stops it
        self.release()


class DecodePool:
    """``workers`` threads; at most ``workers + queue`` requests admitted at once."""

    def __init__(self, workers: int, queue: int):
        if workers < 1 or queue < 0:
            raise ValueError("the pool needs at least one worker and a queue of zero or more")
        self.workers, self.capacity = workers, workers + queue
        self._admitted = 0
        self.cancelled = 0  # jobs stopped because their client left (reported by /health)
        self.running = 0  # jobs on a worker now
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="whisperane-decode")

    def reserve(self) -> Slot:
        """A slot, or QueueFull at once (never waits)."""
        with self._lock:
            if self._admitted >= self.capacity:
                raise QueueFull
            self._admitted += 1
        return Slot(self)

    def free_slot(self) -> None:
        with self._lock:
            self._admitted -= 1

    @property
    def admitted(self) -> int:
        return self._admitted

    def submit(self, job: Job, fn: Callable[..., Any], *args: Any) -> Future:
        def run() -> Any:
            with self._lock:
                self.running += 1
            try:
                job.check()  # a job whose client left while it waited in the queue never starts
                return fn(job, *args)
            except Cancelled:
                with self._lock:
                    self.cancelled += 1
                raise
            finally:
                with self._lock:
                    self.running -= 1
                release_freed_memory()  # what the request freed leaves the resident set with it

        return self._executor.submit(run)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
