"""A loaded model: log-mel, encoder, the decoder adapter, the prefill table and the tokenizer.

``whisperane.loading.open_model`` builds it (as ``whisperane.transcribe.Whisper``, which adds openai-whisper's
``model.transcribe``, for users); every variant (executor, compute type, decoder kind, what the
components are wrapped in) was decided there. The model holds no decoding state: each call takes its own
(``decoding_state``), so one model serves several threads at once (ONNX Runtime sessions are thread-safe). It
runs its components as it was given them, and holds no lock and no count of its users: how requests share the
cores and the memory is decided by whoever schedules them (a server's, ``whisperane.server.scheduling``), with
the components it wrapped at load time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ..audio import HOP_LENGTH, N_SAMPLES, AudioStream
from ..contract import (
    AUDIO,
    ENCODER_OUTPUT,
    KEY_PREFILL,
    MEL_FEATURES,
    PREFILL_LANGUAGE,
    PREFILL_TASK,
    VALUE_PREFILL,
)
from ..tokenizer import Tokenizer
from .bundle import BundleInfo
from .decoder_adapters import CrossAttention, Decoder, cross_attention_reader
from .state import DecoderState

if TYPE_CHECKING:  # imported for annotations only
    from .sessions import BundleKind, Sessions


class WhisperaneModel:
    def __init__(self, info: BundleInfo, kind: BundleKind, sessions: Sessions, decoder: Decoder, tokenizer: Tokenizer):
        self.info = info
        self.path = info.path
        self.dims = info.dims
        self.kind = kind
        self.executor = kind.executor
        self.compute_type = kind.compute_type
        self.decoder = decoder
        self._sessions = sessions
        self._tokenizer = tokenizer
        self._cross = cross_attention_reader(sessions.encoder.outputs, sessions.decoder.inputs, self.dims.n_text_layer)
        self._cross_outputs = [name for name in sessions.encoder.outputs if name != ENCODER_OUTPUT]
        self._prefill_cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._prefill_lock = threading.Lock()

    @property
    def is_multilingual(self) -> bool:
        return self.info.multilingual

    @property
    def cache_length(self) -> int:
        return self.info.cache_length

    def tokenizer(self, language: str | None = None, task: str = "transcribe") -> Tokenizer:
        """A tokenizer for (language, task), sharing the model's parsed vocabulary (not parsed again for each)."""
        return self._tokenizer.with_language(language if self.info.multilingual else None, task)

    def log_mel(self, audio: np.ndarray, file_peak: float | None = None) -> np.ndarray:
        """Up to 30 s of 16 kHz audio -> [1, M, 1, 3000].

        Frames past the audio are zero in the log-mel domain, as openai-whisper and faster-whisper pad a short
        window (``pad_or_trim`` of the mel): the model was trained on that, not on the log-mel of silence.
        ``file_peak``: the largest value of the whole file's log-mel (``mel_peak``). openai-whisper floors the
        log-mel 8 (log10) below the file's maximum, the component below the window's; since the file's is the
        larger, flooring the window's output at ``file_peak - 2`` (8 / 4 in normalized units) gives openai's.
        """
        n = min(len(audio), N_SAMPLES)
        window = np.zeros(N_SAMPLES, dtype=np.float32)
        window[:n] = audio[:n]
        mel = self._sessions.mel.run({AUDIO: window})[MEL_FEATURES]
        content_frames = n // HOP_LENGTH
        if file_peak is not None:
            mel = np.maximum(mel, np.float32(file_peak - 2.0))
        if content_frames < mel.shape[-1]:
            mel = np.array(mel)
            mel[..., content_frames:] = 0.0
        return mel

    def mel_peak(self, stream: AudioStream) -> float:
        """The largest log-mel value of a whole stream (read from its start), window by window."""
        peak, start = -np.inf, 0
        while len(samples := stream.read(start, N_SAMPLES)):
            peak = max(peak, float(self.log_mel(samples).max()))
            start += len(samples)
        return peak

    def encode(self, mel: np.ndarray) -> CrossAttention:
        """Log-mels [B, M, 1, 3000] -> the cross K/V of B windows (the encoder's own output is not fetched: the
        runtime never reads it, and held it would be another [B, d, 1, F] array)."""
        return self._cross(self._sessions.encoder.run(self._encoder_feeds(mel), self._cross_outputs))

    def encode_rows(self, mels: Sequence[np.ndarray], into: CrossAttention | None = None) -> CrossAttention:
        """Windows [1, M, 1, 3000] encoded one call each into the first len(mels) rows of ``into``, a batch of
        cross K/V from an earlier call, or of a new batch where it is None or has fewer rows; the batch written.

        One call a window, not one for the batch: the int8 encoder quantizes its activations with one scale per
        call, so in a batched call a window's encoding would depend on the windows beside it (and the transcript
        with it); one call a window gives every window the encoding the sequential loop gives it, at a small cost
        or none on the CPU.

        Where the encoder's outputs are the decoder's inputs, ONNX Runtime writes them into the batch's rows in
        place: a copy into a new batch each step faults in every page of the new arrays; a reused batch has its
        pages already."""
        if into is None or into.batch < len(mels):
            first = self.encode(mels[0])
            into = CrossAttention({n: np.empty((len(mels), *a.shape[1:]), a.dtype) for n, a in first.feeds.items()},
                                  len(mels))
            into.set_row(0, first)
            mels, start = mels[1:], 1
        else:
            start = 0
        for i, mel in enumerate(mels, start):
            self._encode_row(mel, into, i)
        return into

    def _encode_row(self, mel: np.ndarray, into: CrossAttention, row: int) -> None:
        if not self._cross.in_place:
            into.set_row(row, self.encode(mel))
            return
        rows = {n: into.feeds[n][row : row + 1] for n in self._cross.names}
        self._sessions.encoder.run_into(self._encoder_feeds(mel), rows)

    @staticmethod
    def _encoder_feeds(mel: np.ndarray) -> dict[str, np.ndarray]:
        return {MEL_FEATURES: np.ascontiguousarray(mel, dtype=np.float32)}

    @contextmanager
    def decoding_state(self, batch: int) -> Iterator[DecoderState]:
        """A decoder state of ``batch`` rows for one call, from the pool and back to it afterwards."""
        state = self.decoder.pool.acquire(batch)
        try:
            yield state
        finally:
            self.decoder.pool.release(state)

    def prefill_table(self, task_index: int, language_token: int) -> tuple[np.ndarray, np.ndarray]:
        """The prefill table's K/V [1, d*L, 1, P] for (task, language)."""
        key = (task_index, language_token)
        with self._prefill_lock:
            if key not in self._prefill_cache:
                feeds = {PREFILL_TASK: np.array([task_index], dtype=np.int32),
                         PREFILL_LANGUAGE: np.array([language_token], dtype=np.int32)}
                out = self._sessions.prefill().run(feeds)
                self._prefill_cache[key] = (out[KEY_PREFILL], out[VALUE_PREFILL])
            return self._prefill_cache[key]
