"""The backend boundary's choices, made once at load time: which files of a bundle an executor and compute type
run (``BundleKind``), the sessions that run them (``Sessions``), what each component is wrapped in (``Wrap``:
nothing, ``keep_resident``; the idle weights released, ``IdleWeights``; or a caller's own arrangement, such as a
server's turns in ``whisperane.server.scheduling``) and the decoder adapter that drives them. The model runs
whatever components it was given, and knows nothing of how many callers share them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
# since another component runs next: one component's spinning threads slow the next one on the same cores;
# the float32 kind's separate multi-token decoder
# ("sequence") runs the prompt before the steps and the alignment pass before the next window's log-mel.
SPINNING_ROLES = ("decoder",)


# The components on ``encoder_threads``: the encoder, and the log-mel that runs just before it (and over the whole
# file, for its peak, before the first window).
FRONT_ROLES = ("mel", "encoder")


# ``wrap(role, component, reopen)`` -> the component the model runs for ``role`` ("mel", "encoder", "decoder",
# "sequence", "prefill", "beam"). ``reopen(threads)``: another session of the same file on that many threads,
# or None where the executor has no thread count (Core ML).
Reopen = Callable[[int], Component | None]
Wrap = Callable[[str, Component, Reopen], Component]

# The decoders: the one-token steps' session and the multi-token one (float32 kinds), idle while the encoder runs.
DECODER_ROLES = ("decoder", "sequence")


def keep_resident(role: str, component: Component, reopen: Reopen) -> Component:
    """Every component as opened: its weights stay in the resident set once touched."""
    return component


class Around:
    """A component that runs another one (``inner``), under the same name and tensors."""

    def __init__(self, inner: Component):
        self.inner = inner
        self.name, self.inputs, self.outputs = inner.name, inner.inputs, inner.outputs

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        return self.inner.run(feeds, outputs)

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        self.inner.run_into(feeds, outputs)

    def release_weights(self) -> None:
        self.inner.release_weights()


class IdleWeights:
    """One model's components arranged so that the resident set holds one component's weights, not all of them:
    the decoders' weights leave it for each encoder call, the encoder's after it (``Component.release_weights``;
    the next call maps them back from the page cache). Made for one model at load time (it keeps that model's
    decoders); the peak of a transcription is lower by about one component's weights, at no measured cost in time.

    Nothing here is serialized: where several threads share the model, one thread's release only costs another's
    running call the page faults that map the weights back."""

    def __init__(self):
        self._decoders: list[Component] = []
        self._lock = threading.Lock()  # the multi-token decoder is opened, and kept here, by a background thread

    def __call__(self, role: str, component: Component, reopen: Reopen | None = None) -> Component:
        if role in DECODER_ROLES:
            with self._lock:
                self._decoders.append(component)
            return component
        if role == "encoder":
            return ReleasingEncoder(component, self.release_decoders)
        return component

    def release_decoders(self) -> None:
        """The decoders' weights out of the resident set until their next call."""
        with self._lock:
            decoders = list(self._decoders)
        for decoder in decoders:
            decoder.release_weights()


class ReleasingEncoder(Around):
    """The encoder, with the decoders' weights released before each call (``before``) and its own after it."""

    def __init__(self, encoder: Component, before: Callable[[], None]):
        super().__init__(encoder)
        self._before = before

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        self._before()
        try:
            return self.inner.run(feeds, outputs)
        finally:
            self.inner.release_weights()

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        self._before()
        try:
            self.inner.run_into(feeds, outputs)
        finally:
            self.inner.release_weights()


class Sessions:
    """The kind's components, opened one after another (the decoder first, the largest), each followed by
    returning the heap pages its set-up freed: side by side, their set-up copies coexisted, which made loading
    the peak of a short file's run. The multi-token decoder (first used after a window's encoder and steps)
    opens in the background; the prefill table on first use. Each component is handed to ``wrap`` as it opens,
    and the model runs what ``wrap`` returns: how callers share the components is the wrapper's concern, never
    the sessions'."""

    def __init__(self, bundle: Path, kind: BundleKind, threads: int | None, compute_units: str,
                 encoder_threads: int | None, wrap: Wrap = keep_resident):
        self._bundle, self._kind, self._compute_units = bundle, kind, compute_units
        self._threads = {role: encoder_threads if role in FRONT_ROLES else threads for role in kind.files}
        self._wrap = wrap
        self._lock = threading.Lock()
        self._lazy: dict[str, Component] = {}
        self.sequence: Future | None = None
        if "sequence" in kind.files:
            background = ThreadPoolExecutor(max_workers=1)
            self.sequence = background.submit(self._opened, "sequence")
            background.shutdown(wait=False)
        self.decoder = self._opened("decoder")
        self.encoder = self._opened("encoder")
        self.mel = self._opened("mel")

    def _open(self, role: str, threads: int | None) -> Component:
        component = open_component(self._bundle, self._kind.files[role], self._kind.executor, threads,
                                   self._compute_units, spinning=role in SPINNING_ROLES)
        release_freed_memory()
        return component

    def _opened(self, role: str) -> Component:
        """The role's component on its threads, as ``wrap`` arranges it; ``wrap`` may open the same file again on
        other threads (``reopen``: ONNX Runtime only)."""
        reopen = (lambda n: self._open(role, n)) if self._kind.executor == "onnx" else (lambda n: None)
        return self._wrap(role, self._open(role, self._threads[role]), reopen)

    def get_sequence(self) -> Component | None:
        return None if self.sequence is None else self.sequence.result()

    def prefill(self) -> Component:
        return self.optional("prefill")

    def optional(self, role: str) -> Component | None:
        """A component opened on first use (None when the bundle has none for this role)."""
        with self._lock:
            if role not in self._lazy:
                self._lazy[role] = self._opened(role) if role in self._kind.files else None
            return self._lazy[role]


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
