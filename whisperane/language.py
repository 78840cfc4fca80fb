"""The language a window is decoded in: the one asked for, or the one the model detects on a window (a softmax over
the language tokens after <|startoftranscript|>, as openai-whisper's ``detect_language``)."""

from __future__ import annotations

import numpy as np

from .runtime.decoder_adapters import CrossAttention
from .runtime.model import WhisperaneModel
from .tokenizer import Tokenizer


def detect_language(model: WhisperaneModel, enc: CrossAttention, tokenizer: Tokenizer) -> tuple[str, dict[str, float]]:
    """Softmax over the language tokens of the logits after <|startoftranscript|>."""
    if not model.is_multilingual:
        return "en", {"en": 1.0}
    with model.decoding_state(1) as state:
        logits, _ = model.decoder.step(state, np.array([tokenizer.sot]), enc)
    codes = list(model.info.languages)
    ids = np.array([model.info.languages[c] for c in codes])
    lang_logits = logits[0, ids].astype(np.float64)
    p = np.exp(lang_logits - lang_logits.max())
    p /= p.sum()
    probs = {c: float(v) for c, v in zip(codes, p, strict=True)}
    return codes[int(np.argmax(p))], probs


def choose_language(model: WhisperaneModel, enc: CrossAttention | None, language: str | None,
                    task: str) -> tuple[Tokenizer, dict[str, float] | None]:
    """The tokenizer of ``language``, or of the one detected on ``enc`` (a multilingual model without a
    language; English when there is nothing to detect from: the transcript will be empty), and the detected
    language's probabilities (None where nothing was detected)."""
    probs = None
    if model.is_multilingual and language is None:
        if enc is not None:
            language, probs = detect_language(model, enc, model.tokenizer())
        else:
            language = "en"
    return model.tokenizer(language=language, task=task), probs


class LanguageChoice:
    """One call's language, chosen once (``of``): the one asked for, or the one detected on the first window that
    asks; the loops of a call (batched mode's lanes) share it, so that all decode in the language of the first."""

    def __init__(self, model: WhisperaneModel, language: str | None, task: str):
        self.model, self.language, self.task = model, language, task
        self._chosen: tuple[Tokenizer, dict[str, float] | None] | None = None

    @classmethod
    def of_tokenizer(cls, model: WhisperaneModel, tokenizer: Tokenizer) -> LanguageChoice:
        """The language ``tokenizer`` decodes in, chosen already (a live stream's)."""
        choice = cls(model, tokenizer.language, tokenizer.task)
        choice._chosen = (tokenizer, None)
        return choice

    @property
    def needs_audio(self) -> bool:
        """Whether the language is still to be detected on a window (a multilingual model, no language given)."""
        return self._chosen is None and self.model.is_multilingual and self.language is None

    def of(self, enc: CrossAttention | None) -> tuple[Tokenizer, dict[str, float] | None]:
        """The tokenizer and the detected language's probabilities: chosen on the first call (on ``enc``)."""
        if self._chosen is None:
            self._chosen = choose_language(self.model, enc, self.language, self.task)
        return self._chosen
