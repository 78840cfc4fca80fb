"""A loaded model bundle: its components behind one executor, with the cache buffers the loop reuses.

``WhisperaneModel`` exposes the primitive operations the decoding loop needs — log-mel of a 30 s window,
encoding, one decoder step, a multi-token decoder call and the prefill table — and hides the executor and the
bundle variant (whisperane bundles, or WhisperKit folders whose decoder takes ``encoder_output_embeds``).
One model may be shared by threads: calls that touch the shared buffers hold ``self.lock``.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .audio import HOP_LENGTH, N_SAMPLES
from .bundle import BundleInfo, bundle_name, default_models_dir, rebuild_command, verify_bundle
from .errors import ModelError
from .executors import Component, open_component, release_freed_memory
from .tokenizer import Tokenizer

MASKED = -1e4  # decoder_key_padding_mask value for positions not attended
SHORT_SEQUENCE = 4  # up to this many tokens, forward_tokens runs TextDecoder steps (measured: 4 steps < 1 call)


def layer_views(cache: np.ndarray, n_layer: int) -> list[np.ndarray]:
    """A cache concatenated over layers on the channel axis [B, d*L, 1, T] -> L arrays [B, d, 1, T].

    For batch 1 each layer's slice is contiguous, so these are views (no copy); larger batches are copied.
    """
    d = cache.shape[1] // n_layer
    return [np.ascontiguousarray(cache[:, i * d : (i + 1) * d]) for i in range(n_layer)]


@dataclass
class EncodedWindow:
    """Encoder results for one 30 s window; the cross K/V are shared (batch 1) by every decoded sequence.

    The cross K/V come concatenated over layers ([1, d*L, 1, F], the contract's encoder) or as one [1, d, 1, F]
    array per layer (the int8 encoder); ``layers`` and ``concatenated`` give either form of either.
    """

    embeds: np.ndarray  # [1, d, 1, F]
    key: np.ndarray | list[np.ndarray] | None
    value: np.ndarray | list[np.ndarray] | None

    def layers(self, which: str, n_layer: int) -> list[np.ndarray]:
        """The cross keys (``which="key"``) or values of each layer: views of a concatenated array."""
        cache = getattr(self, which)
        return cache if isinstance(cache, list) else layer_views(cache, n_layer)

    def concatenated(self, which: str) -> np.ndarray | None:
        cache = getattr(self, which)
        if isinstance(cache, list):  # a decoder of the contract fed from the per-layer encoder: one copy, kept
            cache = np.concatenate(cache, axis=1)
            setattr(self, which, cache)
        return cache


class TokenTable:
    """The int8 decoder's token embedding, looked up on the host from a memory-mapped ``.npy`` of packed rows
    (each row: d uint8 values with zero point 128, then d / block fp32 block scales; written by the converter's
    ``quantize.pack_rows``). Only the pages of looked-up tokens become resident."""

    def __init__(self, path: Path, n_vocab: int, dim: int):
        try:
            self.rows = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise ModelError(f"{path}: unreadable token table ({e})") from None
        extra = self.rows.shape[1] - dim if self.rows.ndim == 2 else 0
        if self.rows.dtype != np.uint8 or self.rows.shape[0] != n_vocab or extra <= 0 or (4 * dim) % extra:
            raise ModelError(f"{path}: not a [{n_vocab}, {dim} + scales] uint8 token table ({self.rows.dtype} {self.rows.shape})")
        self.dim = dim
        self.block = 4 * dim // extra

    def lookup(self, tokens: np.ndarray) -> np.ndarray:
        """Token ids [B, T] -> float32 embeddings [B, T, d]."""
        packed = self.rows[tokens]
        lead = packed.shape[:-1]
        q = packed[..., : self.dim].reshape(*lead, self.dim // self.block, self.block)
        scales = np.ascontiguousarray(packed[..., self.dim :]).view("<f4")
        return ((q.astype(np.float32) - 128.0) * scales[..., None]).reshape(*lead, self.dim)


class DecoderState:
    """The fixed-length self-attention cache of B sequences and the masks that go with it.

    The host writes each step's one-position K/V at ``length`` and opens the padding mask there; arrays are
    allocated once per batch size and reused across windows.
    """

    def __init__(self, batch: int, channels: int, cache_length: int):
        self.key = np.zeros((batch, channels, 1, cache_length), dtype=np.float32)
        self.value = np.zeros_like(self.key)
        self.padding = np.full((batch, cache_length), MASKED, dtype=np.float32)
        self.update = np.zeros((batch, cache_length), dtype=np.float32)
        self.length = 0
        self.cache_length = cache_length

    def reset(self) -> None:
        self.padding.fill(MASKED)
        self.length = 0

    def write(self, key: np.ndarray, value: np.ndarray) -> None:
        """Append T positions (key/value [B or 1, d*L, 1, T])."""
        t = key.shape[3]
        end = self.length + t
        if end > self.cache_length:
            raise ModelError(f"decoder cache overflow ({end} > {self.cache_length} positions)")
        self.key[:, :, :, self.length : end] = key
        self.value[:, :, :, self.length : end] = value
        self.padding[:, self.length : end] = 0.0
        self.length = end

    def select(self, rows: np.ndarray) -> None:
        """Reorder/duplicate the batch rows (beam search, best-of)."""
        self.key[:] = self.key[rows]
        self.value[:] = self.value[rows]


COMPUTE_TYPES = ("default", "int8", "float32")


class WhisperaneModel:
    def __init__(self, bundle: Path, executor: str = "onnx", threads: int | None = None, compute_units: str = "ALL",
                 verify: bool = True, compute_type: str = "default"):  # fmt: skip
        self.info = BundleInfo.load(bundle)
        self.path = bundle
        self.executor = executor
        cfg = self.info.config
        self.dims = self.info.dims
        fmt = "onnx" if executor == "onnx" else "coreml"
        self.compute_type = resolve_compute_type(compute_type, executor, cfg, bundle)
        variant = f"{fmt}-int8" if self.compute_type == "int8" else fmt
        wanted = ["MelSpectrogram", "AudioEncoder", "TextDecoder", "TextDecoderContextPrefill", "TextDecoderSequence"]
        rels: dict[str, str] = {}
        for name in wanted:
            entry = cfg.get("components", {}).get(name, {})
            rel = entry.get(variant) or entry.get(fmt)
            if rel is None:
                if name == "TextDecoderSequence":
                    continue
                raise ModelError(f"{bundle}: the bundle has no {fmt} {name}; rebuild it with: whisperane convert "
                                 f"{cfg.get('name', bundle.name)} --formats {fmt} --out {bundle}")  # fmt: skip
            rels[name] = rel
        components = cfg.get("components", {})
        # ONNX Runtime's int8 variant has one decoder graph for both uses: the multi-token TextDecoderSequence,
        # whose one-token calls append the token's K/V by concatenation where TextDecoder blends it in through
        # the one-hot mask (the same cost there: 4.6 vs 4.5 ms a step on tiny.en); one session instead of two
        # holding the same weights.
        shared = variant != fmt and variant in components.get("TextDecoderSequence", {}) and variant not in components.get("TextDecoder", {})
        if shared:
            rels["TextDecoder"] = rels.pop("TextDecoderSequence")
        table = components.get("TextDecoderSequence", {}).get(f"{variant}-embedding") if variant != fmt else None
        if verify:
            verify_bundle(bundle, cfg, [*rels.values(), *([table] if table else []), "tokenizer.json"], use_stamp=True)
        threads = threads or int(os.environ.get("WHISPERANE_THREADS", "0")) or None
        self._open = lambda name: open_component(bundle, rels[name], executor, threads, compute_units)
        # The prefill table is opened on first use (only --prefill table needs it); TextDecoderSequence in the
        # background, since the first window's encoder and decoding steps come before its first use.
        eager = [n for n in rels if n not in ("TextDecoderContextPrefill", "TextDecoderSequence")]
        self._sequence: Future | None = None
        if "TextDecoderSequence" in rels:
            background = ThreadPoolExecutor(max_workers=1)
            self._sequence = background.submit(self._open, "TextDecoderSequence")
            self._sequence.add_done_callback(lambda _: release_freed_memory())
            background.shutdown(wait=False)
        # Sessions are created one after another, the largest first, each followed by returning the heap pages
        # its set-up freed: side by side, their set-up copies (the parsed model, the weights before prepacking)
        # coexist, which made loading the peak of a short file's run (base: 297 -> 245 MB while loading, the same
        # load time). The tokenizer is read meanwhile.
        def open_all() -> dict[str, Component]:
            opened = {}
            for name in sorted(eager, key=lambda n: n != "TextDecoder"):
                opened[name] = self._open(name)
                release_freed_memory()
            return opened

        with ThreadPoolExecutor(max_workers=2) as pool:
            sessions = pool.submit(open_all)
            tokenizer = pool.submit(Tokenizer.from_files, bundle / "tokenizer.json", self.info.special_tokens,
                                    self.info.languages, self.info.multilingual)  # fmt: skip
            self.components: dict[str, Component] = sessions.result()
            self._tokenizer = tokenizer.result()
        self.mel_component = self.components["MelSpectrogram"]
        self.encoder = self.components["AudioEncoder"]
        self.decoder = self.components["TextDecoder"]
        if shared:
            self._sequence = Future()
            self._sequence.set_result(self.decoder)
        release_freed_memory()
        # The int8 decoder takes token embeddings, looked up here (TokenTable says why).
        self.token_table = None
        if "token_embeddings" in self.decoder.inputs:
            if table is None:
                raise ModelError(f"{bundle}: the int8 decoder needs a token table the config does not list; rebuild "
                                 f"with: {rebuild_command(cfg, bundle)}")  # fmt: skip
            self.token_table = TokenTable(bundle / table, self.dims.n_vocab, self.dims.n_text_state)
        # A multi-token decoder graph (the shared int8 variant): steps feed [B, 1] tokens and no update mask.
        self.decoder_appends = "kv_cache_update_mask" not in self.decoder.inputs and "input_ids" in self.decoder.inputs
        # WhisperKit's decoder returns only the mean over the alignment heads ([B, F] rather than [B, A, F]).
        self.alignment_is_mean = len(self.decoder.outputs.get("alignment_heads_weights", (0, 0, 0))) == 2
        self.channels = self.dims.n_text_state * self.dims.n_text_layer
        self.cache_length = self.info.cache_length
        self.n_alignment_heads = len(self.info.alignment_heads)
        self.lock = threading.RLock()
        self._states: dict[int, DecoderState] = {}
        self._prefill_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    @property
    def sequence(self) -> Component | None:
        """The TextDecoderSequence component (None when the bundle has none), waiting for its loading."""
        return None if self._sequence is None else self._sequence.result()

    @property
    def prefill(self) -> Component:
        """The TextDecoderContextPrefill component, opened on first use."""
        with self.lock:
            if "TextDecoderContextPrefill" not in self.components:
                self.components["TextDecoderContextPrefill"] = self._open("TextDecoderContextPrefill")
            return self.components["TextDecoderContextPrefill"]

    # --- tokenizer ------------------------------------------------------------------------------------

    @property
    def is_multilingual(self) -> bool:
        return self.info.multilingual

    def tokenizer(self, language: str | None = None, task: str = "transcribe") -> Tokenizer:
        """A tokenizer for (language, task); the parsed vocabulary is shared (parsing it takes ~0.1 s)."""
        return self._tokenizer.with_language(language if self.info.multilingual else None, task)

    # --- audio side -------------------------------------------------------------------------------------

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        """Up to 30 s of 16 kHz audio -> [1, M, 1, 3000].

        Frames past the audio are zero in the log-mel domain, as openai-whisper and faster-whisper pad a short
        window (``pad_or_trim`` of the mel): the model was trained on that, not on the log-mel of silence.
        """
        n = min(len(audio), N_SAMPLES)
        window = np.zeros(N_SAMPLES, dtype=np.float32)
        window[:n] = audio[:n]
        mel = self.mel_component.run({"audio": window})["melspectrogram_features"]
        content_frames = n // HOP_LENGTH
        if content_frames < mel.shape[-1]:
            mel = np.array(mel)
            mel[..., content_frames:] = 0.0
        return mel

    def encode(self, mel: np.ndarray) -> EncodedWindow:
        out = self.encoder.run({"melspectrogram_features": np.ascontiguousarray(mel, dtype=np.float32)})
        if "encoder_attn_key_cache_0" in out:  # the per-layer (int8) encoder
            n = self.dims.n_text_layer
            keys = [out[f"encoder_attn_key_cache_{i}"] for i in range(n)]
            values = [out[f"encoder_attn_value_cache_{i}"] for i in range(n)]
            return EncodedWindow(out["encoder_output_embeds"], keys, values)
        return EncodedWindow(out["encoder_output_embeds"], out.get("encoder_attn_key_cache"), out.get("encoder_attn_value_cache"))

    # --- decoder side -----------------------------------------------------------------------------------

    def state(self, batch: int) -> DecoderState:
        st = self._states.get(batch)
        if st is None:
            st = self._states[batch] = DecoderState(batch, self.channels, self.cache_length)
        st.reset()
        return st

    def _encoder_feeds(self, enc: EncodedWindow, component: Component) -> dict[str, np.ndarray]:
        # WhisperKit's decoder projects the encoder output itself on every step (variant told apart by names).
        if "encoder_output_embeds" in component.inputs:
            return {"encoder_output_embeds": enc.embeds}
        if "encoder_attn_key_cache_0" in component.inputs:
            n = self.dims.n_text_layer
            return {f"encoder_attn_{which}_cache_{i}": cache
                    for which in ("key", "value") for i, cache in enumerate(enc.layers(which, n))}  # fmt: skip
        return {"encoder_attn_key_cache": enc.concatenated("key"), "encoder_attn_value_cache": enc.concatenated("value")}

    def step(self, state: DecoderState, tokens: np.ndarray, enc: EncodedWindow) -> tuple[np.ndarray, np.ndarray]:
        """Run one token per sequence at position ``state.length``; returns (logits [B, V], alignment [B, A, F])."""
        pos = state.length
        if pos >= state.cache_length:
            raise ModelError("decoder cache is full")
        if self.decoder_appends:  # the new position is attended through the appended K/V, not the cache
            out = self.decoder.run(self._decoder_feeds(state, tokens[:, None], enc, self.decoder))
            state.write(out["key_cache_updates"], out["value_cache_updates"])
            return out["logits"][:, 0, :], out["alignment_heads_weights"][:, :, 0]
        state.update.fill(0.0)
        state.update[:, pos] = 1.0
        state.padding[:, pos] = 0.0
        feeds = self._decoder_feeds(state, tokens, enc, self.decoder)
        feeds["kv_cache_update_mask"] = state.update
        out = self.decoder.run(feeds)
        state.write(out["key_cache_updates"], out["value_cache_updates"])
        return out["logits"][:, 0, :], self._alignment(out["alignment_heads_weights"])

    def _decoder_feeds(self, state: DecoderState, tokens: np.ndarray, enc: EncodedWindow,
                       component: Component) -> dict[str, np.ndarray]:  # fmt: skip
        """The inputs both decoders share: tokens written from ``state.length``, the cache and the encoder side."""
        feeds = {
            "input_ids": tokens.astype(np.int32),
            "cache_length": np.full(tokens.shape[0], state.length, dtype=np.int32),
            "key_cache": state.key,
            "value_cache": state.value,
            "decoder_key_padding_mask": state.padding,
            **self._encoder_feeds(enc, component),
        }
        if "token_embeddings" in component.inputs:
            feeds["token_embeddings"] = self.token_table.lookup(tokens)
        if "key_cache_0" in component.inputs:  # the ONNX Runtime variant: one input per layer for each cache
            for name in ("key_cache", "value_cache"):
                feeds.update({f"{name}_{i}": view for i, view in enumerate(layer_views(feeds.pop(name), self.dims.n_text_layer))})
        return feeds

    def _alignment(self, w: np.ndarray) -> np.ndarray:
        return w if w.ndim == 3 else w.reshape(w.shape[0], 1, -1)  # WhisperKit: mean-only [B, F]

    def forward_tokens(self, state: DecoderState, tokens: np.ndarray, enc: EncodedWindow,
                       need_logits: bool = True) -> tuple[np.ndarray | None, np.ndarray | None]:  # fmt: skip
        """Run T tokens per sequence from ``state.length`` (tokens [B, T]); returns (logits [B, T, V],
        alignment [B, A, T, F]). Uses TextDecoderSequence when the bundle has one and T > SHORT_SEQUENCE, else T
        single steps.

        ``need_logits=False`` only fills the cache (a prompt whose predictions nobody reads): the vocabulary
        projection of every position, the larger part of the call, is then not computed; returns (None, None).
        """
        b, t = tokens.shape
        if state.length + t > state.cache_length:
            raise ModelError(f"{t} tokens do not fit the decoder cache at position {state.length}")
        # A few tokens (a prefix after <|startoftranscript|>) cost less as single steps than as one call.
        if t <= SHORT_SEQUENCE or self.sequence is None:
            logits, align = zip(*(self.step(state, tokens[:, i], enc) for i in range(t)), strict=True)
            return (np.stack(logits, axis=1), np.stack(align, axis=2)) if need_logits else (None, None)
        wanted = None if need_logits else ["key_cache_updates", "value_cache_updates"]
        out = self.sequence.run(self._decoder_feeds(state, tokens, enc, self.sequence), wanted)
        state.write(out["key_cache_updates"], out["value_cache_updates"])
        if not need_logits:
            return None, None
        return out["logits"], out["alignment_heads_weights"]

    def prefill_table(self, task_index: int, language_token: int) -> tuple[np.ndarray, np.ndarray]:
        """The table's K/V [1, d*L, 1, P] for (task, language)."""
        key = (task_index, language_token)
        if key not in self._prefill_cache:
            out = self.prefill.run({"task": np.array([task_index], dtype=np.int32), "language": np.array([language_token], dtype=np.int32)})
            self._prefill_cache[key] = (out["key_cache_prefill"], out["value_cache_prefill"])
        return self._prefill_cache[key]


def resolve_compute_type(compute_type: str, executor: str, config: dict, bundle: Path) -> str:
    """"int8" or "float32". ``default`` is int8 where it pays: ONNX Runtime on the CPU (its int8 kernels halve the
    weight traffic of every decoder step), with a bundle that has int8 components; float32 otherwise."""
    if compute_type not in COMPUTE_TYPES:
        raise ModelError(f"unknown compute type {compute_type!r}; use {', '.join(COMPUTE_TYPES)}")
    has_int8 = any(f"{executor}-int8" in entry for entry in config.get("components", {}).values())
    if compute_type == "int8" and not has_int8:
        raise ModelError(f"{bundle}: the bundle has no int8 {executor} components; rebuild it with: "
                         f"{rebuild_command(config, bundle)}")  # fmt: skip
    if compute_type == "default":
        from .executors import uses_cpu_only

        return "int8" if has_int8 and executor == "onnx" and uses_cpu_only() else "float32"
    return compute_type


def resolve_bundle(name_or_path: str | os.PathLike, convert_missing: bool = True) -> Path:
    """A bundle directory for a model name or path; converts the named model on first use."""
    p = Path(name_or_path)
    if p.is_dir() and (p / "config.json").is_file():
        return p
    if p.is_dir() and (p / "MelSpectrogram.mlmodelc").exists():
        return p
    candidate = default_models_dir() / bundle_name(name_or_path)
    if (candidate / "config.json").is_file():
        return candidate
    if not convert_missing:
        raise ModelError(f"no bundle for {name_or_path!r} in {candidate.parent}; build it with: whisperane convert {name_or_path}")
    try:
        from .convert.pipeline import convert
    except ImportError as e:
        raise ModelError(
            f"model {name_or_path!r} is not converted yet and the build side is not installed ({e.name} missing); "
            "install with: pip install torch==2.13.0 'whisperane[convert]'"
        ) from None
    return convert(str(name_or_path), progress=_stderr_progress)


def _stderr_progress(msg: str) -> None:
    import sys

    print(f"whisperane: {msg}", file=sys.stderr, flush=True)


def load_model(name_or_path: str | os.PathLike = "tiny.en", executor: str = "onnx", threads: int | None = None,
               compute_units: str = "ALL", compute_type: str = "default") -> WhisperaneModel:  # fmt: skip
    """Load a bundle by model name (converted on first use) or directory, ready to transcribe.

    ``compute_type``: "int8" (int8 decoder weights), "float32", or "default" (int8 on the CPU with ONNX Runtime
    when the bundle has it, as faster-whisper's int8; float32 elsewhere)."""
    return WhisperaneModel(resolve_bundle(name_or_path), executor=executor, threads=threads, compute_units=compute_units,
                           compute_type=compute_type)  # fmt: skip
