"""Whisper's tokenizer on the run side: a byte-level BPE vocabulary plus Whisper's specials.

The bundle ships a complete ``tokenizer.json`` (timestamp tokens included) and, in its config, the ids of the
special tokens and the language tokens; this module wraps both the way openai-whisper's ``Tokenizer`` does.

Transcribing only decodes: token ids -> bytes -> text, done here from a table of each token's bytes. Encoding
text (an initial prompt, a prefix) needs the BPE merges and goes through the `tokenizers` package, loaded on
first use: loading it costs resident memory that a plain transcription never needs.
"""

from __future__ import annotations

import json
import string
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from pathlib import Path

from .audio import TIME_PRECISION
from .errors import ModelError, WhisperaneError
from .token_table import read_table, table_path, write_table

# Whisper's languages, in the order of their tokens (<|en|> first); yue exists only in large-v3's vocabulary.
LANGUAGES = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "ru": "russian",
    "ko": "korean",
    "fr": "french",
    "ja": "japanese",
    "pt": "portuguese",
    "tr": "turkish",
    "pl": "polish",
    "ca": "catalan",
    "nl": "dutch",
    "ar": "arabic",
    "sv": "swedish",
    "it": "italian",
    "id": "indonesian",
    "hi": "hindi",
    "fi": "finnish",
    "vi": "vietnamese",
    "he": "hebrew",
    "uk": "ukrainian",
    "el": "greek",
    "ms": "malay",
    "cs": "czech",
    "ro": "romanian",
    "da": "danish",
    "hu": "hungarian",
    "ta": "tamil",
    "no": "norwegian",
    "th": "thai",
    "ur": "urdu",
    "hr": "croatian",
    "bg": "bulgarian",
    "lt": "lithuanian",
    "la": "latin",
    "mi": "maori",
    "ml": "malayalam",
    "cy": "welsh",
    "sk": "slovak",
    "te": "telugu",
    "fa": "persian",
    "lv": "latvian",
    "bn": "bengali",
    "sr": "serbian",
    "az": "azerbaijani",
    "sl": "slovenian",
    "kn": "kannada",
    "et": "estonian",
    "mk": "macedonian",
    "br": "breton",
    "eu": "basque",
    "is": "icelandic",
    "hy": "armenian",
    "ne": "nepali",
    "mn": "mongolian",
    "bs": "bosnian",
    "kk": "kazakh",
    "sq": "albanian",
    "sw": "swahili",
    "gl": "galician",
    "mr": "marathi",
    "pa": "punjabi",
    "si": "sinhala",
    "km": "khmer",
    "sn": "shona",
    "yo": "yoruba",
    "so": "somali",
    "af": "afrikaans",
    "oc": "occitan",
    "ka": "georgian",
    "be": "belarusian",
    "tg": "tajik",
    "sd": "sindhi",
    "gu": "gujarati",
    "am": "amharic",
    "yi": "yiddish",
    "lo": "lao",
    "uz": "uzbek",
    "fo": "faroese",
    "ht": "haitian creole",
    "ps": "pashto",
    "tk": "turkmen",
    "nn": "nynorsk",
    "mt": "maltese",
    "sa": "sanskrit",
    "lb": "luxembourgish",
    "my": "myanmar",
    "bo": "tibetan",
    "tl": "tagalog",
    "mg": "malagasy",
    "as": "assamese",
    "tt": "tatar",
    "haw": "hawaiian",
    "ln": "lingala",
    "ha": "hausa",
    "ba": "bashkir",
    "jw": "javanese",
    "su": "sundanese",
    "yue": "cantonese",
}

# language code lookup by name, with a few language aliases
TO_LANGUAGE_CODE = {
    **{language: code for code, language in LANGUAGES.items()},
    "burmese": "my",
    "valencian": "ca",
    "flemish": "nl",
    "haitian": "ht",
    "letzeburgesch": "lb",
    "pushto": "ps",
    "panjabi": "pa",
    "moldavian": "ro",
    "moldovan": "ro",
    "sinhalese": "si",
    "castilian": "es",
    "mandarin": "zh",
}

TASKS = ("transcribe", "translate")

# The keys of the special-token dict stored in a bundle's config.json.
SPECIAL_TOKEN_KEYS = (
    "eot",
    "sot",
    "sot_prev",
    "sot_lm",
    "no_speech",
    "no_timestamps",
    "timestamp_begin",
    "transcribe",
    "translate",
)

# Languages written without spaces between words: words are split wherever the tokens decode to whole
# unicode characters instead.
UNICODE_SPLIT_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})

N_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>


def normalize_language(language: str | None) -> str | None:
    """A language code from a code or a name (``"German"``, ``"de"``); None stays None."""
    if language is None:
        return None
    key = language.strip().lower()
    if key in LANGUAGES:
        return key
    if key in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[key]
    raise WhisperaneError(
        f"unknown language '{language}'; use a code such as en, de, zh or a name such as german"
    )


def non_speech_tokens(encode: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
    """Tokens that start speaker tags or non-speech annotations (``♪♪♪``, ``( SPEAKING FOREIGN LANGUAGE )``,
    ``[DAVID] Hey``), computed with ``encode`` exactly as openai-whisper computes them; basic punctuation
    (commas, periods, question marks, ...) stays allowed."""
    symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
    symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()

    # These may be one token or several depending on the vocabulary; when several, the first is safe to
    # suppress: they lie in U+2640..U+267F and share the first two bytes of their UTF-8 form.
    miscellaneous = set("♩♪♫♬♭♮♯")

    # allow hyphens "-" and single quotes "'" between words, but not at the beginning of a word
    result = {encode(" -")[0], encode(" '")[0]}
    for symbol in symbols + sorted(miscellaneous):
        for tokens in (encode(symbol), encode(" " + symbol)):
            if len(tokens) == 1 or symbol in miscellaneous:
                result.add(tokens[0])
    return tuple(sorted(result))


def _byte_decoder() -> dict[int, str]:
    """GPT-2's byte-level alphabet reversed: the printable character standing for each byte -> that byte
    (as a one-character latin-1 string, for ``str.translate``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    stand_ins = {b: b for b in printable}
    for b in range(256):
        if b not in stand_ins:
            stand_ins[b] = 256 + len(stand_ins) - len(printable)
    return {char: chr(b) for b, char in stand_ins.items()}


class Vocabulary:
    """A byte-level BPE ``tokenizer.json``: decoding from each token's bytes, encoding through `tokenizers`.

    Decoding matches the `tokenizers` ByteLevel decoder: the tokens' bytes joined, invalid UTF-8 replaced by
    U+FFFD (``String::from_utf8_lossy`` and Python's ``errors="replace"`` both replace each maximal invalid
    subsequence).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            raw = self.path.read_bytes()
        except OSError as err:
            raise ModelError(f"{self.path}: cannot load the tokenizer: {err}") from None
        kept = table_path(self.path, raw)
        table = read_table(kept)
        if table is None:
            table = self._table_from_json(raw)
            write_table(kept, table)
        self.token_bytes: list[bytes] = table
        self._backend = None
        self._lock = threading.Lock()

    def _table_from_json(self, raw: bytes) -> list[bytes]:
        """Each token's bytes, from the JSON's vocabulary (its printable stand-ins mapped back to bytes)."""
        try:
            spec = json.loads(raw)
            model, decoder = spec["model"], spec.get("decoder") or {}
            vocab: dict[str, int] = model["vocab"]
            if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
                raise ValueError(f"not a byte-level BPE (model {model.get('type')}, decoder {decoder.get('type')})")
            byte_decoder = _byte_decoder()
            table = [b""] * (max(vocab.values()) + 1)
            for text, index in vocab.items():
                table[index] = text.translate(byte_decoder).encode("latin-1")
            return table
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeError) as err:
            raise ModelError(f"{self.path}: cannot load the tokenizer: {err}") from None

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of regular (non-special) token ids."""
        table = self.token_bytes
        try:
            return b"".join([table[t] for t in tokens]).decode("utf-8", errors="replace")
        except IndexError:
            raise ModelError(f"{self.path}: token id outside the vocabulary ({max(tokens)})") from None

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    @property
    def backend(self):
        """The `tokenizers` Tokenizer for encoding, loaded on first use."""
        with self._lock:
            if self._backend is None:
                import tokenizers

                try:
                    self._backend = tokenizers.Tokenizer.from_file(str(self.path))
                except Exception as err:  # tokenizers raises a bare Exception on unreadable JSON
                    raise ModelError(f"{self.path}: cannot load the tokenizer: {err}") from err
            return self._backend


class Tokenizer:
    """openai-whisper's ``Tokenizer`` over a byte-level BPE: text <-> ids, specials, word splitting.

    ``language`` is the transcript's language (None for a multilingual model whose language is still to be
    detected); English-only models always use ``"en"`` and a bare ``<|startoftranscript|>`` prefix.
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        special: Mapping[str, int],
        languages: Mapping[str, int],
        multilingual: bool,
        language: str | None = None,
        task: str = "transcribe",
    ):
        missing = [key for key in SPECIAL_TOKEN_KEYS if key not in special]
        if missing:
            raise ModelError(f"tokenizer special-token table lacks {', '.join(missing)}")
        if task not in TASKS:
            raise WhisperaneError(f"unknown task '{task}'; use transcribe or translate")
        self.vocabulary = vocabulary
        self.special = {key: int(special[key]) for key in SPECIAL_TOKEN_KEYS}
        self.languages = {code: int(token) for code, token in languages.items()}
        self.multilingual = multilingual
        self.task = task

        self.eot = self.special["eot"]
        self.sot = self.special["sot"]
        self.sot_prev = self.special["sot_prev"]
        self.sot_lm = self.special["sot_lm"]
        self.no_speech = self.special["no_speech"]
        self.no_timestamps = self.special["no_timestamps"]
        self.timestamp_begin = self.special["timestamp_begin"]
        self.transcribe = self.special["transcribe"]
        self.translate = self.special["translate"]

        code = normalize_language(language)
        if multilingual:
            if code is not None and code not in self.languages:
                raise ModelError(f"language '{code}' is not supported by this model")
            self.language = code
            self.language_token = None if code is None else self.languages[code]
            task_token = self.transcribe if task == "transcribe" else self.translate
            prefix = [self.sot] if code is None else [self.sot, self.language_token]
            self.sot_sequence: tuple[int, ...] = (*prefix, task_token)
        else:
            # English-only vocabularies still hold language tokens, but the models never saw them: any
            # requested language is transcribed as English, as openai-whisper does.
            self.language = "en"
            self.language_token = None
            self.sot_sequence = (self.sot,)

    @classmethod
    def from_files(
        cls,
        tokenizer_json: Path,
        special: Mapping[str, int],
        languages: Mapping[str, int],
        multilingual: bool,
        language: str | None = None,
        task: str = "transcribe",
    ) -> Tokenizer:
        return cls(Vocabulary(tokenizer_json), special, languages, multilingual, language, task)

    def with_language(self, language: str | None, task: str | None = None) -> Tokenizer:
        """The same vocabulary with another language (e.g. once it has been detected) or task."""
        return Tokenizer(
            self.vocabulary, self.special, self.languages, self.multilingual, language, task or self.task
        )

    @property
    def sot_sequence_including_notimestamps(self) -> tuple[int, ...]:
        return (*self.sot_sequence, self.no_timestamps)

    @property
    def all_language_tokens(self) -> tuple[int, ...]:
        return tuple(self.languages.values())

    @property
    def all_language_codes(self) -> tuple[str, ...]:
        return tuple(self.languages)

    def to_language_token(self, language: str) -> int:
        code = normalize_language(language)
        if code not in self.languages:
            raise ModelError(f"language '{language}' is not supported by this model")
        return self.languages[code]

    def encode(self, text: str) -> list[int]:
        return self.vocabulary.encode(text)

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``; special and timestamp tokens (ids >= eot) are dropped."""
        return self.vocabulary.decode([int(t) for t in tokens if t < self.eot])

    def decode_with_timestamps(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` with timestamp tokens written as ``<|1.08|>``; other specials dropped."""
        outputs: list[str | list[int]] = [[]]
        for token in tokens:
            if token >= self.timestamp_begin:
                outputs.append(f"<|{(token - self.timestamp_begin) * TIME_PRECISION:.2f}|>")
                outputs.append([])
            else:
                outputs[-1].append(int(token))  # type: ignore[union-attr]
        return "".join(part if isinstance(part, str) else self._decode_piece(part) for part in outputs)

    def _decode_piece(self, tokens: list[int]) -> str:
        # As openai-whisper (tiktoken) does, specials below the timestamps are not part of the text.
        return self.vocabulary.decode([t for t in tokens if t < self.eot])

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        return non_speech_tokens(self.encode)

    def split_to_word_tokens(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """Group ``tokens`` into words: at spaces and punctuation for most languages, at unicode-character
        boundaries for languages written without spaces."""
        if self.language in UNICODE_SPLIT_LANGUAGES:
            return self.split_tokens_on_unicode(tokens)
        return self.split_tokens_on_spaces(tokens)

    def split_tokens_on_unicode(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        decoded_full = self.decode_with_timestamps(tokens)
        replacement_char = "\ufffd"

        words: list[str] = []
        word_tokens: list[list[int]] = []
        current_tokens: list[int] = []
        unicode_offset = 0

        for token in tokens:
            current_tokens.append(int(token))
            decoded = self.decode_with_timestamps(current_tokens)
            index = decoded.find(replacement_char)
            # An incomplete UTF-8 sequence decodes to U+FFFD: keep accumulating tokens unless the full text
            # really has a replacement character at that position.
            if index < 0 or (
                index + unicode_offset < len(decoded_full)
                and decoded_full[index + unicode_offset] == replacement_char
            ):
                words.append(decoded)
                word_tokens.append(current_tokens)
                current_tokens = []
                unicode_offset += len(decoded)

        return words, word_tokens

    def split_tokens_on_spaces(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        subwords, subword_tokens_list = self.split_tokens_on_unicode(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []

        for subword, subword_tokens in zip(subwords, subword_tokens_list, strict=True):
            special = subword_tokens[0] >= self.eot
            with_space = subword.startswith(" ")
            punctuation = subword.strip() in string.punctuation
            if special or with_space or punctuation or len(words) == 0:
                words.append(subword)
                word_tokens.append(subword_tokens)
            else:
                words[-1] = words[-1] + subword
                word_tokens[-1].extend(subword_tokens)

        return words, word_tokens
