"""The options of a transcription and of one window's decoding: validated once, when they are made.

``TranscribeOptions`` carries openai-whisper's ``transcribe()`` names and defaults plus whisperane's own
(``prefill``, ``alignment``); ``DecodingOptions`` for each window and temperature are derived from it
(``TranscribeOptions.decoding``). Each field carries its help text, from which ``whisperane.arguments`` builds
the command lines' flags, so a new option is one field.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from .diarize.clustering import SpeakerCount
from .errors import OptionsError
from .tokenizer import TASKS, normalize_language

PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # merged with the word after them
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"  # merged with the word before them

TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
PREFILLS = ("exact", "table")
ALIGNMENTS = ("teacher-forced", "decode")
# how a model is loaded (load_model's compute_type and executor; the CLIs' --compute-type and --executor)
COMPUTE_TYPES = ("default", "int8", "float32")
EXECUTORS = ("onnx", "coreml")


def _help(text: str, **cli) -> dict:
    return {"help": text, **cli}


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = field(default=None, metadata=_help("language code or name (e.g. en, german); detected when omitted"))
    task: str = field(default="transcribe", metadata=_help("transcribe, or translate to English", choices=TASKS))
    word_timestamps: bool = field(default=True, metadata=_help("word-level timestamps (DTW over the alignment heads)"))
    temperature: float | Sequence[float] = field(default=TEMPERATURES, metadata=_help(
        "temperatures tried in turn (fallback)", cli=False))
    compression_ratio_threshold: float | None = field(default=2.4, metadata=_help("fall back when the text's gzip ratio is above this"))
    logprob_threshold: float | None = field(default=-1.0, metadata=_help("fall back when the average log-probability is below this"))
    no_speech_threshold: float | None = field(default=0.6, metadata=_help("a window is silent when <|nospeech|> is above this and the log-probability is low"))
    condition_on_previous_text: bool = field(default=True, metadata=_help("prompt each window with the previous window's text"))
    initial_prompt: str | None = field(default=None, metadata=_help("text that prompts the first window"))
    carry_initial_prompt: bool = field(default=False, metadata=_help(
        "the initial prompt before every window's prompt, the previous text trimmed to fit (openai-whisper's)"))
    hotwords: str | None = field(default=None, metadata=_help(
        "words to bias toward, before the previous text in every window's prompt (faster-whisper's; not with prefix)"))
    prefix: str | None = field(default=None, metadata=_help("forced start of each window's text"))
    clip_timestamps: str | Sequence[float] = field(default="0", metadata=_help("start,end,start,end,... seconds to transcribe"))
    hallucination_silence_threshold: float | None = field(default=None, metadata=_help(
        "skip silences longer than this (seconds) around a likely hallucination (needs word timestamps)"))
    prepend_punctuations: str = field(default=PREPEND_PUNCTUATIONS, metadata=_help("merged with the next word"))
    append_punctuations: str = field(default=APPEND_PUNCTUATIONS, metadata=_help("merged with the previous word"))
    best_of: int | None = field(default=5, metadata=_help("samples at temperature > 0"))
    beam_size: int | None = field(default=None, metadata=_help("beams at temperature 0 (None: greedy)"))
    patience: float | None = field(default=None, metadata=_help(
        "beam search collects round(beam_size * patience) finished hypotheses (default 1.0)"))
    length_penalty: float | None = field(default=None, metadata=_help(
        "rank hypotheses by log-probability / ((5 + length) / 6) ** alpha (None: / length)"))
    suppress_tokens: str | Sequence[int] | None = field(default="-1", metadata=_help(
        "comma-separated token ids to suppress; -1: the non-speech symbols"))
    suppress_blank: bool = field(default=True, metadata=_help("no blank or end of text as the first token"))
    without_timestamps: bool = field(default=False, metadata=_help("sample text tokens only"))
    max_initial_timestamp: float | None = field(default=1.0, metadata=_help("latest first timestamp (seconds)"))
    vad_filter: bool = field(default=False, metadata=_help(
        "transcribe only the speech Silero VAD finds (timestamps stay on the original audio)"))
    vad_parameters: dict | None = field(default=None, metadata=_help(
        "VadOptions fields (threshold, min_silence_duration_ms, speech_pad_ms, ...)", cli=False))
    speech_guard: bool = field(default=True, metadata=_help(
        "a window that leaves 1.5 s of voice without words (a decoding that stopped early or jumped over "
        "speech) is decoded again from there, once; Silero VAD checks only such stretches"))
    multilingual: bool = field(default=False, metadata=_help(
        "each stretch of speech (VAD regions) in its own detected language; a window never holds two; "
        "segments carry their language"))
    batch_size: int | None = field(default=None, metadata=_help(
        "batched mode: VAD speech in chunks of at most 30 s, this many decoded at once"))
    diarize: bool = field(default=False, metadata=_help(
        "speaker labels (SPEAKER_00, ...) on every word and segment; segments split where the speaker changes"))
    num_speakers: int | None = field(default=None, metadata=_help("with diarize: the number of speakers (else estimated)"))
    min_speakers: int | None = field(default=None, metadata=_help("with diarize: at least this many speakers"))
    max_speakers: int | None = field(default=None, metadata=_help("with diarize: at most this many speakers"))
    known_speakers: dict | None = field(default=None, metadata=_help(
        "with diarize: {name: reference clip (a path or a 16 kHz array, 2-10 s of the voice)}: a speaker whose voice "
        "matches one is labelled with its name (the CLI's --speaker NAME=clip.wav)", cli=False))
    prefill: str = field(default="exact", metadata=_help("exact prefix, or WhisperKit's prefill lookup table", choices=PREFILLS))
    alignment: str = field(default="teacher-forced", metadata=_help(
        "word-timing rows: a teacher-forced pass, or gathered while decoding", choices=ALIGNMENTS))

    def __post_init__(self) -> None:
        object.__setattr__(self, "language", _language(self.language))
        object.__setattr__(self, "temperature", _temperatures(self.temperature))
        object.__setattr__(self, "clip_timestamps", clip_values(self.clip_timestamps))
        object.__setattr__(self, "suppress_tokens", token_ids(self.suppress_tokens))
        _choice("task", self.task, TASKS)
        _choice("prefill", self.prefill, PREFILLS)
        _choice("alignment", self.alignment, ALIGNMENTS)
        for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
            _optional_number(name, getattr(self, name))
        for name in ("hallucination_silence_threshold", "max_initial_timestamp"):
            _optional_number(name, getattr(self, name), minimum=0.0)
        _search_options(self.best_of, self.beam_size, self.patience, self.length_penalty)
        _batched_mode(self)
        _multilingual(self)
        _speaker_options(self)
        for name in ("initial_prompt", "prefix", "hotwords"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise OptionsError(f"{name} must be text")
        if self.hotwords and self.prefix:  # faster-whisper drops them where a prefix is given: every window here
            raise OptionsError("hotwords apply where no prefix is given, and a prefix starts every window: give one")
        for name in ("word_timestamps", "condition_on_previous_text", "carry_initial_prompt", "suppress_blank",
                     "without_timestamps", "vad_filter", "speech_guard", "diarize", "multilingual"):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(f"{name} must be True or False, not {getattr(self, name)!r}")

    def decoding(self, temperature: float, language: str | None, prompt: Sequence[int] | None, seed: int) -> DecodingOptions:
        """The options of one window's decoding at one temperature."""
        return DecodingOptions(
            task=self.task, language=language, temperature=temperature,
            best_of=self.best_of if temperature > 0 else None, beam_size=None if temperature > 0 else self.beam_size,
            patience=None if temperature > 0 else self.patience, length_penalty=self.length_penalty,
            prompt=list(prompt) if prompt else None,
            prefix=self.prefix, hotwords=self.hotwords, suppress_tokens=self.suppress_tokens, suppress_blank=self.suppress_blank,
            without_timestamps=self.without_timestamps, max_initial_timestamp=self.max_initial_timestamp,
            prefill=self.prefill, seed=seed,
            # A loop fails the compression-ratio check once decoded to the token limit: a decoding stops in it once
            # its text fails the check already (beam search decodes to the end). Without the check, openai keeps a
            # loop whole.
            stop_at_repetition=self.compression_ratio_threshold is not None,
            loop_ratio=self.compression_ratio_threshold,
        )

    @property
    def speaker_count(self) -> SpeakerCount:
        return SpeakerCount(self.num_speakers, self.min_speakers, self.max_speakers)

    def to_kwargs(self) -> dict:
        """The fields as ``transcribe()`` keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_options_for_model(options: TranscribeOptions, is_multilingual: bool) -> None:
    """OptionsError where ``options`` ask what the model cannot do: an English-only model neither translates nor
    transcribes another language. Options are checked alone when made; this is their one check against a model
    (``transcribe()``, a live stream and the server call it before any audio is read)."""
    if is_multilingual:
        return
    if options.task == "translate":
        raise OptionsError("English-only models cannot translate; use a multilingual model")
    if options.multilingual:
        raise OptionsError("English-only models transcribe English only: multilingual needs a multilingual model")
    if options.language not in (None, "en"):
        raise OptionsError(f"English-only models transcribe English only, not {options.language!r}")


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"
    language: str | None = None
    temperature: float = 0.0
    sample_len: int | None = None  # default: n_text_ctx // 2
    best_of: int | None = None  # independent samples at temperature > 0
    beam_size: int | None = None  # beam search at temperature 0
    patience: float | None = None  # finished hypotheses collected: round(beam_size * patience)
    length_penalty: float | None = None  # None: rank by log-probability / length; else the GNMT penalty
    prompt: str | Sequence[int] | None = None  # text of the previous window(s), fed after <|startofprev|>
    prefix: str | Sequence[int] | None = None  # forced start of the current window's text
    hotwords: str | Sequence[int] | None = None  # before the prompt, where no prefix is given (faster-whisper's)
    suppress_tokens: str | Iterable[int] | None = "-1"
    suppress_blank: bool = True
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    prefill: str = "exact"  # "exact" (multi-token decoder) or "table" (TextDecoderContextPrefill, WhisperKit)
    seed: int = 0  # sampling at temperature > 0 is seeded: the same input gives the same output
    stop_at_repetition: bool = False  # end a sample where its text starts to loop, the loop cut (repetition.py)
    # With stop_at_repetition: stop once the text's compression ratio is over this too, the sample ranked on all it
    # decoded and the result failing as too repetitive (a file's fallback); None: at the loop's first repeat (live).
    loop_ratio: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "language", _language(self.language))
        _choice("task", self.task, TASKS)
        _choice("prefill", self.prefill, PREFILLS)
        _optional_number("temperature", self.temperature, minimum=0.0)
        _optional_number("loop_ratio", self.loop_ratio)
        if self.temperature is None:
            raise OptionsError("temperature must be a number >= 0")
        if self.sample_len is not None and (not _is_int(self.sample_len) or self.sample_len < 1):
            raise OptionsError(f"sample_len must be a positive integer, not {self.sample_len!r}")
        _search_options(self.best_of, self.beam_size, self.patience, self.length_penalty)
        if self.beam_size is not None and self.best_of is not None:
            raise OptionsError("beam_size and best_of can't be given together")
        if self.temperature == 0 and self.best_of is not None:
            raise OptionsError("best_of with greedy sampling (temperature 0) is not compatible")


# --- validation -------------------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _choice(name: str, value, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise OptionsError(f"unknown {name} {value!r}; use {' or '.join(allowed)}")


def _optional_number(name: str, value, minimum: float = -math.inf) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        bound = f" >= {minimum:g}" if minimum > -math.inf else ""
        raise OptionsError(f"{name} must be a finite number{bound} or None, not {value!r}")


def _batched_mode(options: TranscribeOptions) -> None:
    """What batched mode (independent VAD chunks decoded together, greedily) can and cannot combine with."""
    if options.vad_parameters is not None and not isinstance(options.vad_parameters, dict):
        raise OptionsError("vad_parameters must be a dict of VadOptions fields")
    if options.batch_size is None:
        return
    if not _is_int(options.batch_size) or options.batch_size < 1:
        raise OptionsError(f"batch_size must be a positive integer, not {options.batch_size!r}")
    if options.beam_size is not None:
        raise OptionsError("batched mode decodes greedily: leave beam_size unset or drop batch_size")
    if options.clip_timestamps != (0.0,) or options.hallucination_silence_threshold is not None:
        raise OptionsError("batched mode chooses its chunks by VAD: clip_timestamps and "
                           "hallucination_silence_threshold apply to the sequential mode")


def _multilingual(options: TranscribeOptions) -> None:
    """multilingual detects each stretch's language and decodes the VAD's speech as it chooses its runs."""
    if options.multilingual is not True:
        return
    if options.language is not None:
        raise OptionsError("multilingual detects the language of each stretch of speech: give no language")
    if options.batch_size is not None or options.clip_timestamps != (0.0,):
        raise OptionsError("multilingual chooses its stretches by VAD: batch_size and clip_timestamps do not apply")


def _speaker_options(options: TranscribeOptions) -> None:
    """The speaker count's options: valid numbers (``SpeakerCount``), and only with diarize."""
    counts = {name: getattr(options, name) for name in ("num_speakers", "min_speakers", "max_speakers")}
    SpeakerCount(**counts)
    given = [name for name, value in counts.items() if value is not None]
    if options.known_speakers is not None:
        _known_speakers(options.known_speakers)
        given.append("known_speakers")
    if given and options.diarize is not True:
        raise OptionsError(f"{given[0]} applies to speaker labels: add diarize")


def _known_speakers(known: object) -> None:
    """Names (one word each, not a SPEAKER_nn label, as RTTM has them) mapped to paths or arrays."""
    if not isinstance(known, dict) or not known:
        raise OptionsError("known_speakers must map speaker names to reference clips (paths or arrays)")
    for name, clip in known.items():
        if not isinstance(name, str) or not re.fullmatch(r"\S{1,64}", name) or name.startswith("SPEAKER_"):
            raise OptionsError(f"known speaker name {name!r}: one word of at most 64 characters, not SPEAKER_nn")
        if not isinstance(clip, (str, os.PathLike, np.ndarray)):
            raise OptionsError(f"known speaker {name!r}: the reference must be a path or an array, not "
                               f"{type(clip).__name__}")


def _search_options(best_of, beam_size, patience, length_penalty) -> None:
    """openai-whisper's rules for best_of, beam_size, patience and length_penalty."""
    for name, value in (("best_of", best_of), ("beam_size", beam_size)):
        if value is not None and (not _is_int(value) or value < 1):
            raise OptionsError(f"{name} must be a positive integer, not {value!r}")
    _optional_number("patience", patience, minimum=0.0)
    if patience is not None and beam_size is None:
        raise OptionsError("patience requires beam_size to be given")
    _optional_number("length_penalty", length_penalty, minimum=0.0)
    if length_penalty is not None and length_penalty > 1:
        raise OptionsError("length_penalty (alpha) should be a value between 0 and 1")
    if patience is not None and round(beam_size * patience) < 1:
        raise OptionsError("patience leaves no hypothesis to collect: round(beam_size * patience) must be >= 1")


def _language(value: str | None) -> str | None:
    if value is not None and not isinstance(value, str):
        raise OptionsError(f"language must be a code or a name, not {value!r}")
    try:
        return normalize_language(value)
    except Exception as e:  # normalize_language's WhisperaneError, as an option error
        raise OptionsError(str(e)) from None


def _temperatures(value) -> tuple[float, ...]:
    values = (value,) if isinstance(value, (int, float)) else value
    try:
        temps = tuple(float(t) for t in values if not isinstance(t, bool))
    except (TypeError, ValueError):
        raise OptionsError(f"temperature must be a number or a sequence of numbers, not {value!r}") from None
    if not temps or len(temps) != len(values) or any(not math.isfinite(t) or t < 0 for t in temps):
        raise OptionsError(f"temperature must be one or more finite numbers >= 0, not {value!r}")
    return temps


def clip_values(value: str | Sequence[float]) -> tuple[float, ...]:
    """clip_timestamps as seconds: start, end, start, end, ... (a final start runs to the end of the audio)."""
    try:
        if isinstance(value, str):
            values = tuple(float(x) for x in value.split(",") if x.strip())
        else:
            values = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        raise OptionsError(f"clip_timestamps must be comma-separated seconds, not {value!r}") from None
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise OptionsError("clip_timestamps must be finite, non-negative seconds")
    return values or (0.0,)


def token_ids(value) -> tuple[int, ...] | None:
    """Token ids from a comma-separated string or a sequence (``suppress_tokens``); -1 stands for the default set."""
    if value is None:
        return None
    try:
        ids = [int(t) for t in value.split(",") if t.strip()] if isinstance(value, str) else [int(t) for t in value]
    except (TypeError, ValueError):
        raise OptionsError(f"suppress_tokens must be comma-separated token ids, not {value!r}") from None
    if any(t < -1 for t in ids):
        raise OptionsError("suppress_tokens must be token ids (or -1 for the default set)")
    return tuple(ids)


__all__ = ["DecodingOptions", "TranscribeOptions"]
