"""How the server's requests share the cores and the memory (``Schedule``): the models are loaded with their
components wrapped for it, and the decode pool counts the requests running (``Schedule.request``).

Three arrangements, each measured where the server runs several decodes at once; a process with one caller needs
only the second (the command line asks for ``IdleWeights`` alone):

- One encoder call at a time, on all the workers' cores (``EncoderTurn``): a call on all of them is about as fast
  as one per core side by side (its matrix products divide evenly), a call alone is that much sooner, and its
  activations (every head's attention scores are a window's largest array) are held once, not once per worker. One turn for every model the server loads: they share
  the cores.
- The idle components' weights out of the resident set (``runtime.sessions.IdleWeights``), inside the turn: the
  peak holds one component's weights.
- A request alone decodes on all the cores (``WhenAlone``): the decoder is opened a second time on the encoder's
  threads, and each call runs on it while one request is running, on the narrow one otherwise; a request alone
  would otherwise leave the other cores idle while it decodes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ..loading import open_model
from ..runtime.sessions import Around, IdleWeights, Reopen, Wrap
from ..transcribe import Whisper
from .models import model_ids

if TYPE_CHECKING:  # imported for annotations only
    from ..runtime.executors import Component
    from ..runtime.model import WhisperaneModel


class Schedule:
    """The server's requests over its models: each decode on ``threads``, the encoder and the log-mel (and a lone
    request's decoder) on ``encoder_threads``. ``load_models`` loads the models for it; the decode pool holds
    ``request()`` around each job it runs (a file's transcription, a live stream's update)."""

    def __init__(self, threads: int = 1, encoder_threads: int | None = None):
        self.threads = threads
        self.encoder_threads = encoder_threads or threads
        self._turn = threading.Lock()  # the encoder's, for every model
        self._lock = threading.Lock()
        self._running = 0

    def load_models(self, names: list[str]) -> dict[str, WhisperaneModel]:
        """The models by id (``server.models.model_ids``), each loaded with its components wrapped for this
        schedule."""
        return {key: self.load_model(name) for key, name in model_ids(names).items()}

    def load_model(self, name_or_path) -> Whisper:
        return open_model(name_or_path, threads=self.threads, encoder_threads=self.encoder_threads,
                          wrap=self.wrapper(), model_class=Whisper)

    def wrapper(self) -> Wrap:
        """The wrap for one model's components (``open_model``'s ``wrap``): a model's own weights are released
        around its encoder calls, the turn is every model's."""
        idle = IdleWeights()

        def wrap(role: str, component: Component, reopen: Reopen) -> Component:
            if role == "decoder" and self.encoder_threads > self.threads:
                wide = reopen(self.encoder_threads)
                if wide is not None:
                    component = WhenAlone(component, wide, self.alone)
            component = idle(role, component, reopen)
            return EncoderTurn(component, self._turn) if role == "encoder" else component

        return wrap

    @contextmanager
    def request(self) -> Iterator[None]:
        """Held by the decode pool around each job it runs."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    @property
    def running(self) -> int:
        """Requests running now."""
        with self._lock:
            return self._running

    def alone(self) -> bool:
        """Whether one request (or none) runs now."""
        return self.running <= 1


class EncoderTurn(Around):
    """The encoder, one call at a time among all the callers that share ``turn``."""

    def __init__(self, encoder: Component, turn: threading.Lock):
        super().__init__(encoder)
        self._turn = turn

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        with self._turn:
            return self.inner.run(feeds, outputs)

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        with self._turn:
            self.inner.run_into(feeds, outputs)


class WhenAlone:
    """One component opened twice, ``narrow`` (a worker's threads) and ``wide`` (all the workers' cores): each
    call runs on ``wide`` while ``alone()``, else on ``narrow``, chosen under a lock. When the calls move from one
    to the other, the one left releases its weights (both resident would be the weights twice); a call still
    running on it only maps its weights back."""

    def __init__(self, narrow: Component, wide: Component, alone: Callable[[], bool]):
        self.narrow, self.wide, self._alone = narrow, wide, alone
        self.name, self.inputs, self.outputs = narrow.name, narrow.inputs, narrow.outputs
        self._lock = threading.Lock()
        self._last = narrow
        wide.release_weights()

    def _now(self) -> Component:
        with self._lock:
            now = self.wide if self._alone() else self.narrow
            if now is not self._last:
                self._last.release_weights()
                self._last = now
            return now

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        return self._now().run(feeds, outputs)

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        self._now().run_into(feeds, outputs)

    def release_weights(self) -> None:
        self.narrow.release_weights()
        self.wide.release_weights()
