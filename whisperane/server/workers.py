"""The bounded decode pool: a fixed number of worker threads over the shared models, a bounded queue behind them.

A request takes a slot before its upload is read (``DecodePool.reserve``): when every worker is busy and the
queue is full it is refused at once (503 with Retry-After), so neither memory nor the spool directory grows with
the number of waiting clients. Each job carries a cancel flag and a time budget; the request's decode checks them
after each window of its transcription (``Job.check``), which raises once the client has gone, the budget is
spent or the server is stopping, so the work stops at the next window. A closed pool (the server is
stopping) admits nothing more, and ``stop_all`` stops every admitted job with the reason its client is told.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import WhisperaneError
from ..runtime.executors import release_freed_memory
from .scheduling import Schedule


def _without_frames(e: BaseException) -> BaseException:
    """``e`` (and what it was raised from) without its traceback. An expected failure would otherwise carry the
    decode's frames, and with them its audio, mel and encoder buffers, to the event loop's thread, where they are
    let go after this thread's trim: glibc keeps such late frees in this thread's arena, and the resident set grows
    with every cancelled request."""
    link: BaseException | None = e
    while link is not None:
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return e


class Cancelled(Exception):
    """Raised from a job's check once it was stopped; ``reason``: what its client is told (None: the
    client has gone, nobody is told)."""

    def __init__(self, reason: Exception | None = None):
        super().__init__(str(reason or "the client has gone"))
        self.reason = reason


class QueueFull(Exception):
    """Every worker is busy and the queue behind them is full."""


class Closed(Exception):
    """The pool admits nothing more: the server is stopping."""


@dataclass
class Job:
    """One request's decode: its cancel flag, why it was stopped, its time budget (seconds of work from the start
    of its first run, None: unbounded) and the callbacks that run on the worker thread."""

    cancel: threading.Event = field(default_factory=threading.Event)
    reason: Exception | None = None
    budget_s: float | None = None
    over_budget: Exception | None = None  # the reason given when the budget is spent
    started: float | None = None

    def limit(self, seconds: float, reason: Exception) -> None:
        """Stop the job, telling its client ``reason``, once it has worked ``seconds``."""
        self.budget_s, self.over_budget = seconds, reason

    def stop(self, reason: Exception | None = None) -> None:
        """Stop at the next window; the first reason given is the one told."""
        if not self.cancel.is_set():
            self.reason = reason
            self.cancel.set()

    def check(self) -> None:
        """Raise ``Cancelled`` once stopped or over budget (between two windows of a transcription, between two
        blocks of an upload's decoding)."""
        if self.budget_s is not None and self.started is not None and time.monotonic() - self.started > self.budget_s:
            self.stop(self.over_budget)
        if self.cancel.is_set():
            raise Cancelled(self.reason)


class Slot:
    """A reserved place in the pool (a worker or the queue); released when the request ends, however it ends."""

    def __init__(self, pool: DecodePool):
        self._pool = pool
        self._released = False
        self.job = Job()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool.free_slot(self)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(job, *args)`` on a worker; a cancelled await (the client went away) cancels the job."""
        future = self._pool.submit(self.job, fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.job.stop()
            raise

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.job.stop()  # a request that ends while its job still runs (an error elsewhere) stops it
        self.release()


class DecodePool:
    """``workers`` threads; at most ``workers + queue`` requests admitted at once. Each job runs inside
    ``schedule.request()``: the schedule the server's models were loaded with (``server.scheduling``) knows from it
    how many requests run."""

    def __init__(self, workers: int, queue: int, schedule: Schedule | None = None):
        if workers < 1 or queue < 0:
            raise ValueError("the pool needs at least one worker and a queue of zero or more")
        self.workers, self.capacity = workers, workers + queue
        self.schedule = schedule or Schedule()
        self._slots: set[Slot] = set()
        self.closed = False
        self.cancelled = 0  # jobs stopped because their client left (reported by /health)
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="whisperane-decode")

    def reserve(self) -> Slot:
        """A slot, or QueueFull (Closed once the server stops) at once: never waits."""
        with self._lock:
            if self.closed:
                raise Closed
            if len(self._slots) >= self.capacity:
                raise QueueFull
            slot = Slot(self)
            self._slots.add(slot)
        return slot

    def free_slot(self, slot: Slot) -> None:
        with self._lock:
            self._slots.discard(slot)

    @property
    def admitted(self) -> int:
        return len(self._slots)

    @property
    def running(self) -> int:
        """Jobs on a worker now."""
        return self.schedule.running

    def close(self) -> None:
        """Admit nothing more (the server is stopping); the slots held run on."""
        with self._lock:
            self.closed = True

    def stop_all(self, reason: Exception) -> None:
        """Stop every admitted job at its next window, telling its client ``reason``."""
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            slot.job.stop(reason)

    def submit(self, job: Job, fn: Callable[..., Any], *args: Any) -> Future:
        def run() -> Any:
            try:
                with self.schedule.request():
                    return self._run(job, fn, args)
            finally:
                release_freed_memory()  # what the request freed leaves the resident set with it

        return self._executor.submit(run)

    def _run(self, job: Job, fn: Callable[..., Any], args: tuple) -> Any:
        if job.started is None:
            job.started = time.monotonic()  # the budget counts work, not the wait in the queue
        try:
            job.check()  # a job whose client left while it waited in the queue never starts
            return fn(job, *args)
        except (Cancelled, WhisperaneError) as e:
            failure = _without_frames(e)
            with self._lock:
                self.cancelled += isinstance(e, Cancelled) and e.reason is None
        raise failure

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
