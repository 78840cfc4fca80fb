"""Loading a model, in one pass: resolve the name or path -> convert if missing -> verify -> pick the compute
type and the decoder adapter -> open the sessions. Every variant is decided here, once."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .bundle import BundleInfo, rebuild_command, resolve_bundle, verify_bundle
from .decoder import AppendingDecoder, CacheLayout, Decoder, OneHotDecoder, StatefulDecoder, TokenTable
from .errors import ModelError
from .executors import Component, open_component, release_freed_memory, uses_cpu_only
from .model import WhisperaneModel
from .tokenizer import Tokenizer

COMPUTE_TYPES = ("default", "int8", "float32")
EXECUTORS = ("onnx", "coreml")


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
                         f"{rebuild_command(info.config, info.path)}")  # fmt: skip
    if compute_type == "default":
        return "int8" if has_int8 and executor == "onnx" and uses_cpu_only() else "float32"
    return compute_type


def coreml_has_state() -> bool:
    """MLState needs macOS 15 (the stateful decoder's deployment target)."""
    import platform

    release = platform.mac_ver()[0]
    return sys.platform == "darwin" and bool(release) and int(release.split(".")[0]) >= 15


def choose_kind(info: BundleInfo, executor: str, compute_type: str) -> BundleKind:
    if executor not in EXECUTORS:
        raise ModelError(f"unknown executor {executor!r}; use onnx or coreml")
    ctype = choose_compute_type(compute_type, executor, info)
    int8 = executor == "onnx" and ctype == "int8"
    stateful = executor == "coreml" and coreml_has_state() and info.component("TextDecoder", "coreml_stateful")
    wanted = {
        "mel": ("MelSpectrogram", executor),
        "encoder": ("AudioEncoder", "onnx-int8" if int8 else executor),
        "decoder": ("TextDecoderSequence", "onnx-int8") if int8 else ("TextDecoder", "coreml_stateful" if stateful else executor),
        "prefill": ("TextDecoderContextPrefill", executor),
    }
    if int8:
        wanted["table"] = ("TextDecoderSequence", "onnx-int8-embedding")
    elif executor == "onnx":
        wanted["sequence"] = ("TextDecoderSequence", "onnx")
    elif stateful:
        wanted["beam"] = ("TextDecoder", "coreml_stateful_beam")  # 5 rows of MLState: beams, samples
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
# since another component runs next: the log-mel's spinning slowed the encoder after it, and the encoder's the
# previous-text prompt (tiny.en, in process: a prompt of 224 tokens took 95-100 ms right after an encoder call,
# 61-65 ms 50 ms later); the float32 kind's separate multi-token decoder ("sequence") runs the prompt before the
# steps and the alignment pass before the next window's log-mel.
SPINNING_ROLES = ("decoder",)


class Sessions:
    """The kind's components, opened one after another (the decoder first, the largest), each followed by
    returning the heap pages its set-up freed: side by side, their set-up copies coexisted, which made loading
    the peak of a short file's run (base: 297 -> 245 MB while loading). The multi-token decoder (first used
    after a window's encoder and steps) opens in the background; the prefill table on first use."""

    def __init__(self, bundle: Path, kind: BundleKind, threads: int | None, compute_units: str):
        self._files = kind.files
        self._open = lambda role: open_component(bundle, kind.files[role], kind.executor, threads, compute_units,
                                                 spinning=role in SPINNING_ROLES)  # fmt: skip
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


def build_decoder(kind: BundleKind, info: BundleInfo, sessions: Sessions) -> Decoder:
    dims = info.dims
    per_layer = kind.decoder == "appending"
    layout = CacheLayout(dims.n_text_layer, dims.n_text_state, info.cache_length, per_layer)
    if kind.decoder == "appending":
        table = TokenTable(info.path / kind.files["table"], dims.n_vocab, dims.n_text_state)
        return AppendingDecoder(layout, dims.n_vocab, sessions.decoder, table)
    if kind.decoder == "stateful":
        return StatefulDecoder(layout, dims.n_vocab, sessions.decoder, sessions.optional("beam"))
    return OneHotDecoder(layout, dims.n_vocab, sessions.decoder, sessions.get_sequence)


def load_model(name_or_path: str | os.PathLike = "tiny.en", executor: str = "onnx", threads: int | None = None,
               compute_units: str = "ALL", compute_type: str = "default", verify: bool = True) -> WhisperaneModel:  # fmt: skip
    """Load a bundle by model name (converted on first use) or directory, ready to transcribe.

    ``compute_type``: "int8" (int8 encoder and decoder weights), "float32", or "default" (int8 on the CPU with
    ONNX Runtime when the bundle has it, as faster-whisper's int8; float32 elsewhere). ``threads``: the
    executor's threads per call (default: ``$WHISPERANE_THREADS``, else all cores)."""
    bundle = resolve_bundle(name_or_path)
    info = BundleInfo.load(bundle)
    kind = choose_kind(info, executor, compute_type)
    if verify:
        verify_bundle(bundle, info.config, kind.verified_files(), use_stamp=True)
    threads = threads or int(os.environ.get("WHISPERANE_THREADS", "0")) or None
    with ThreadPoolExecutor(max_workers=1) as pool:  # the tokenizer is read while the sessions open
        tokenizer = pool.submit(Tokenizer.from_files, bundle / "tokenizer.json", info.special_tokens,
                                info.languages, info.multilingual)  # fmt: skip
        sessions = Sessions(bundle, kind, threads, compute_units)
        decoder = build_decoder(kind, info, sessions)
        model = WhisperaneModel(info, kind, sessions, decoder, tokenizer.result())
    release_freed_memory()
    return model


_LOADED: dict[tuple, WhisperaneModel] = {}
_LOADED_LOCK = threading.Lock()


def shared_model(name_or_path: str | os.PathLike, executor: str = "onnx", compute_type: str = "default") -> WhisperaneModel:
    """A model loaded once per (name or path, executor, compute type) and reused by later calls, as
    ``transcribe(model="tiny.en")`` needs: loading costs more than a short file's transcription."""
    key = (os.fspath(name_or_path), executor, compute_type)
    with _LOADED_LOCK:
        if key not in _LOADED:
            _LOADED[key] = load_model(name_or_path, executor=executor, compute_type=compute_type)
        return _LOADED[key]
