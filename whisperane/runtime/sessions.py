"""The backend boundary's choices, made once at load time: which files of a bundle an executor and compute type
run (``BundleKind``), the sessions that run them (``Sessions``) and the decoder adapter that drives them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..contract import (
    AUDIO_ENCODER,
    MEL_SPECTROGRAM,
    TEXT_DECODER,
    TEXT_DECODER_PREFILL,
    TEXT_DECODER_SEQUENCE,
)
from ..errors import ModelError
from ..options import COMPUTE_TYPES, EXECUTORS
from .bundle import BundleInfo, rebuild_command
from .coreml import CoreMLComponent, StatefulDecoder, coreml_has_state
from .decoder_adapters import AppendingDecoder, Decoder, OneHotDecoder, TokenTable
from .executors import Component, OnnxComponent, release_freed_memory, uses_cpu_only
from .state import CacheLayout


@dataclass(frozen=True)
class BundleKind:
    """Which files of a bundle one executor and compute type run, and which decoder adapter drives them."""

    executor: str
    compute_type: str  # "int8" or "float32" (Core ML: float16 inside, float32 at the boundary)
    decoder: str  # "one-hot", "appending" (ONNX int8) or "stateful" (Core ML MLState)
    files: dict[str, str]  # role -> path in the bundle: mel, encoder, decoder, sequence, prefill, table

    def verified_files(self) -> list[str]:
        return [*self.files.values(), "tokenizer.json"]


def choose_compute_type(compute_type: str, executor: str, info: BundleInfo) -> str:
    """"int8" or "float32". ``default`` is int8 where it pays: ONNX Runtime on the CPU (its int8 kernels halve the
    weight traffic of every decoder step), with a bundle that has int8 components; float32 otherwise."""
    if compute_type not in COMPUTE_TYPES:
        raise ModelError(f"unknown compute type {compute_type!r}; use {', '.join(COMPUTE_TYPES)}")
    has_int8 = any(f"{executor}-int8" in entry for entry in info.config.get("components", {}).values())
    if compute_type == "int8" and not has_int8:
        raise ModelError(f"{info.path}: the bundle has no int8 {executor} components; rebuild it with: "
                         f"{rebuild_command(info.config, info.path)}")
    if compute_type == "default":
        return "int8" if has_int8 and executor == "onnx" and uses_cpu_only() else "float32"
    return compute_type


def choose_kind(info: BundleInfo, executor: str, compute_type: str) -> BundleKind:
    if executor not in EXECUTORS:
        raise ModelError(f"unknown executor {executor!r}; use onnx or coreml")
    ctype = choose_compute_type(compute_type, executor, info)
    int8 = executor == "onnx" and ctype == "int8"
    stateful = executor == "coreml" and coreml_has_state() and info.component(TEXT_DECODER, "coreml_stateful")
    wanted = {
        "mel": (MEL_SPECTROGRAM, executor),
        "encoder": (AUDIO_ENCODER, "onnx-int8" if int8 else executor),
        "decoder": (TEXT_DECODER_SEQUENCE, "onnx-int8") if int8 else (TEXT_DECODER, "coreml_stateful" if stateful else executor),
        "prefill": (TEXT_DECODER_PREFILL, executor),
    }
    if int8:
        wanted["table"] = (TEXT_DECODER_SEQUENCE, "onnx-int8-embedding")
    elif executor == "onnx":
        wanted["sequence"] = (TEXT_DECODER_SEQUENCE, "onnx")
    elif stateful:
        wanted["beam"] = (TEXT_DECODER, "coreml_stateful_beam")  # 5 rows of MLState: beams, samples
    files = {}
    for role, (name, variant) in wanted.items():
        rel = info.component(name, variant)
        if rel is None and role not in ("sequence", "beam"):  # optional: single steps; one row at a time
            what = "the int8 decoder needs a token table the config does not list" if role == "table" else \
                f"the bundle has no {variant} {name}"
            raise ModelError(f"{info.path}: {what}; rebuild it with: {rebuild_command(info.config, info.path)}")
        if rel is not None:
            files[role] = rel
    decoder = "appending" if int8 else "stateful" if stateful else "one-hot"
    return BundleKind(executor, ctype, decoder, files)


# The component whose calls follow one another, the one-token steps' ("decoder"; with int8 weights it also takes
# the multi-token calls): its ONNX Runtime threads spin between calls. The others' threads sleep when a call ends,
# since another component runs next: one component's spinning threads slow the next one on the same cores
# (benchmarks/results/2026-12-03-session18-weighted-values.md); the float32 kind's separate multi-token decoder
# ("sequence") runs the prompt before the steps and the alignment pass before the next window's log-mel.
SPINNING_ROLES = ("decoder",)


# The components on ``encoder_threads``: the encoder, and the log-mel that runs just before it (and over the whole
# file, for its peak, before the first window).
FRONT_ROLES = ("mel", "encoder")


class Sessions:
    """The kind's components, opened one after another (the decoder first, the largest), each followed by
    returning the heap pages its set-up freed: side by side, their set-up copies coexisted, which made loading
    the peak of a short file's run (base: 297 -> 245 MB while loading). The multi-token decoder (first used
    after a window's encoder and steps) opens in the background; the prefill table on first use. Where the
    encoder has more threads than a request (a server's workers), the decoder is opened a second time on the
    encoder's threads, for a request that has the model to itself (``WhenAlone``)."""

    def __init__(self, bundle: Path, kind: BundleKind, threads: int | None, compute_units: str,
                 encoder_threads: int | None):
        self._files = kind.files
        self._open = lambda role, n=None: open_component(bundle, kind.files[role], kind.executor,
                                                         n or (encoder_threads if role in FRONT_ROLES else threads),
                                                         compute_units, spinning=role in SPINNING_ROLES)
        self.users = Users()
        self._lock = threading.Lock()
        self._lazy: dict[str, Component] = {}
        self.sequence: Future | None = None
        if "sequence" in kind.files:
            background = ThreadPoolExecutor(max_workers=1)
            self.sequence = background.submit(self._open, "sequence")
            self.sequence.add_done_callback(lambda _: release_freed_memory())
            background.shutdown(wait=False)
        opened = {}
        for role in ("decoder", "encoder", "mel"):
            opened[role] = self._open(role)
            release_freed_memory()
        self.decoder, self.encoder, self.mel = opened["decoder"], opened["encoder"], opened["mel"]
        if kind.executor == "onnx" and threads and encoder_threads and encoder_threads > threads:
            self.decoder = WhenAlone(self.decoder, self._open("decoder", encoder_threads), self.users.alone)
            release_freed_memory()

    def get_sequence(self) -> Component | None:
        return None if self.sequence is None else self.sequence.result()

    def release_decoder_weights(self) -> None:
        """The decoders' weights out of the resident set until their next call (while the encoder runs)."""
        self.decoder.release_weights()
        if self.sequence is not None and self.sequence.done() and self.sequence.exception() is None:
            self.sequence.result().release_weights()

    def prefill(self) -> Component:
        return self.optional("prefill")

    def optional(self, role: str) -> Component | None:
        """A component opened on first use (None when the bundle has none for this role)."""
        with self._lock:
            if role not in self._lazy:
                self._lazy[role] = self._open(role) if role in self._files else None
            return self._lazy[role]


class Users:
    """How many requests (a file's transcription, a live stream's update) use the model now."""

    def __init__(self):
        self._count = 0
        self._lock = threading.Lock()

    @contextmanager
    def using(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1

    def alone(self) -> bool:
        return self._count <= 1


class WhenAlone:
    """One component opened twice: each call runs on ``wide`` (more threads) while ``alone()``, else on
    ``narrow``. A server's workers each decode on one core; a request with the model to itself would leave the
    others idle while it decodes (benchmarks/results/2026-12-06-session31-server.md). When the calls move from
    one to the other, the one left releases its weights (both resident would be the weights twice)."""

    def __init__(self, narrow: Component, wide: Component, alone: Callable[[], bool]):
        self.narrow, self.wide, self._alone = narrow, wide, alone
        self.name, self.inputs, self.outputs = narrow.name, narrow.inputs, narrow.outputs
        self._last = narrow
        wide.release_weights()

    def _now(self) -> Component:
        now = self.wide if self._alone() else self.narrow
        if now is not self._last:  # a release during the other's call only costs that call its page faults
            left, self._last = self._last, now
            left.release_weights()
        return now

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        return self._now().run(feeds, outputs)

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        self._now().run_into(feeds, outputs)

    def release_weights(self) -> None:
        self.narrow.release_weights()
        self.wide.release_weights()


def open_decoder(kind: BundleKind, info: BundleInfo, sessions: Sessions) -> Decoder:
    dims = info.dims
    per_layer = kind.decoder == "appending"
    layout = CacheLayout(dims.n_text_layer, dims.n_text_state, info.cache_length, per_layer)
    if kind.decoder == "appending":
        table = TokenTable(info.path / kind.files["table"], dims.n_vocab, dims.n_text_state)
        return AppendingDecoder(layout, sessions.decoder, table)
    if kind.decoder == "stateful":
        return StatefulDecoder(layout, sessions.decoder, sessions.optional("beam"))
    return OneHotDecoder(layout, sessions.decoder, sessions.get_sequence)


def open_component(bundle: Path, rel: str, executor: str, threads: int | None, compute_units: str,
                   spinning: bool = True) -> Component:
    path = bundle / rel
    if executor == "onnx":
        return OnnxComponent(path, threads, spinning=spinning)
    compiled = path.with_suffix(".mlmodelc")  # compiled on macOS next to the package
    return CoreMLComponent(compiled if compiled.exists() else path, compute_units)
