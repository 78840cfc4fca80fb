"""The server's models by id (``ModelRegistry``): each loaded at start, or on its first request (``lazy``), and
unloaded once idle for longer than its time to live (speaches' ``WHISPER__TTL``: -1 never, 0 as soon as nothing
uses it). A request or a live stream holds its model through a ``Lease`` from its start to its end, so no model
is unloaded under one; a request that arrives while its model is unloaded (or being unloaded) loads it again and
waits for that, as the first request of a lazy model does. Ids are fixed at start: no request can make the
server open a path or download."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import WhisperaneError
from ..loading import resolve_bundle
from ..runtime.bundle import BundleInfo
from ..runtime.executors import release_freed_memory

if TYPE_CHECKING:  # imported for annotations only
    from ..runtime.model import WhisperaneModel

FIRST_MODEL_ID = "whisper-1"  # OpenAI's model name: the first model the server loaded


def model_id(name: str) -> str:
    """A model's id in requests: its name, or a bundle directory's name."""
    return Path(name).name if os.sep in name or Path(name).is_dir() else name


def model_ids(names: Sequence[str]) -> dict[str, str]:
    """{id: name} in the given order; an error where two names have one id, or one is OpenAI's whisper-1."""
    ids: dict[str, str] = {}
    for name in names:
        key = model_id(name)
        if key in ids or key == FIRST_MODEL_ID:
            raise WhisperaneError(f"two models would have the id '{key}'")
        ids[key] = name
    return ids


@dataclass
class ModelSlot:
    """One id's model: its source, the model while loaded, who holds it, and a lock its loads and unloads take."""

    source: str | Path  # what ``load`` takes: a name, or the bundle it resolved to
    model: WhisperaneModel | None = None
    users: int = 0
    generation: int = 0  # bumped by every acquire and release: an expiry set before is void
    lock: threading.Lock = field(default_factory=threading.Lock)


class Lease:
    """A request's hold on its model; ``release()`` once it ends (more calls do nothing)."""

    def __init__(self, registry: ModelRegistry, key: str, model: WhisperaneModel):
        self.registry, self.key, self.model = registry, key, model
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.model = None  # a lease kept after its request must not keep an unloaded model alive
            self.registry.release(self.key)


class ModelRegistry:
    """The models by id, in order (``whisper-1``: the first). ``load(source)`` opens one (the schedule's
    ``load_model``); ``ttl``: seconds a model may stay idle before it is unloaded, -1 never, 0 at once."""

    def __init__(self, names: Sequence[str], load: Callable[[str | Path], WhisperaneModel], ttl: float = -1,
                 lazy: bool = False, preloaded: dict[str, WhisperaneModel] | None = None):
        if not names:
            raise ValueError("the server needs at least one model")
        if ttl < 0 and ttl != -1:
            raise WhisperaneError(f"--model-ttl must be -1 (never unload), 0 or more seconds, not {ttl:g}")
        self.load, self.ttl = load, ttl
        self.slots: dict[str, ModelSlot] = {}
        for key, name in model_ids(names).items():
            model = (preloaded or {}).get(key)
            # A lazy model's bundle is found (converted if it is missing) now: a bad name fails at start.
            self.slots[key] = ModelSlot(name if model is not None else resolve_bundle(name), model)
            if model is None and not lazy:
                self.slots[key].model = load(self.slots[key].source)
        self.timers: set[threading.Timer] = set()  # unloads pending
        self._closed = False

    @classmethod
    def of_loaded(cls, models: dict[str, WhisperaneModel]) -> ModelRegistry:
        """The registry of models loaded already (``Schedule.load_models``), never unloaded."""
        return cls(list(models), lambda source: models[str(source)], preloaded=models)

    def __iter__(self) -> Iterator[str]:
        return iter(self.slots)

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, model_id: object) -> bool:
        return model_id == FIRST_MODEL_ID or model_id in self.slots

    def key(self, model_id: str) -> str:
        """The id a request's ``model`` names (whisper-1: the first); KeyError for an unknown one."""
        if model_id == FIRST_MODEL_ID:
            return next(iter(self.slots))
        if model_id not in self.slots:
            raise KeyError(model_id)
        return model_id

    def loaded(self, model_id: str) -> bool:
        return self.slots[self.key(model_id)].model is not None

    def languages(self, model_id: str) -> tuple[bool, list[str]]:
        """Whether the model is multilingual, and the languages it transcribes; from its bundle while unloaded."""
        slot = self.slots[self.key(model_id)]
        model = slot.model
        if model is not None:
            return model.is_multilingual, list(model.tokenizer().all_language_codes) if model.is_multilingual else ["en"]
        info = BundleInfo.load(Path(slot.source))
        return info.multilingual, list(info.languages) if info.multilingual else ["en"]

    def acquire(self, model_id: str) -> Lease:
        """The model, held until the lease is released; loaded first where it is not (the caller waits)."""
        key = self.key(model_id)
        slot = self.slots[key]
        with slot.lock:  # waits while this model loads or unloads
            if slot.model is None:
                slot.model = self.load(slot.source)
            slot.users += 1
            slot.generation += 1
            return Lease(self, key, slot.model)

    async def lease(self, model_id: str) -> Lease:
        """``acquire`` off the event loop; a request cancelled while it waits still releases what it got."""
        future = asyncio.get_running_loop().run_in_executor(None, self.acquire, model_id)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().release())
            raise

    def release(self, key: str) -> None:
        slot = self.slots[key]
        with slot.lock:
            slot.users -= 1
            slot.generation += 1
            if slot.users or self.ttl < 0 or self._closed:
                return
            generation = slot.generation
        # Unloaded on a timer's thread, also at a ttl of 0: the release may run on the event loop.
        timer = threading.Timer(self.ttl, self._expire, (key, generation))
        timer.daemon = True
        self.timers.add(timer)
        timer.start()

    def _expire(self, key: str, generation: int) -> None:
        slot = self.slots[key]
        try:
            with slot.lock:
                if slot.users or slot.generation != generation or slot.model is None:
                    return  # used again since, or already unloaded
                slot.model = None
                release_freed_memory()  # the sessions' memory back to the system with the last reference
        finally:
            self.timers.discard(threading.current_thread())

    def close(self) -> None:
        """No more unloads (the server is stopping)."""
        self._closed = True
        for timer in list(self.timers):
            timer.cancel()
