"""Build a bundle's complete tokenizer.json and the token tables that go into its config.json.

Sources: a CTranslate2 directory (its tokenizer.json lacks the 1501 timestamp tokens; ``vocabulary.txt``
or ``vocabulary.json`` lists every id, timestamps included), a Hugging Face directory (tokenizer.json, or
vocab.json + merges.txt + added_tokens.json), or for an OpenAI ``.pt`` file, which holds no tokenizer, either
of those given as ``tokenizer_dir``. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from ..audio import TIME_PRECISION
from ..errors import ModelError
from ..tokenizer import LANGUAGES, N_TIMESTAMPS, SPECIAL_TOKEN_KEYS, non_speech_tokens

# Token text of each special, as the Whisper vocabularies spell them. ``<|nocaptions|>`` is the older name
# of ``<|nospeech|>`` (the token id is the same).
_SPECIAL_TEXT = {
    "eot": ("<|endoftext|>",),
    "sot": ("<|startoftranscript|>",),
    "sot_prev": ("<|startofprev|>",),
    "sot_lm": ("<|startoflm|>",),
    "no_speech": ("<|nospeech|>", "<|nocaptions|>"),
    "no_timestamps": ("<|notimestamps|>",),
    "transcribe": ("<|transcribe|>",),
    "translate": ("<|translate|>",),
}

MULTILINGUAL_MIN_VOCAB = 51865  # openai-whisper: n_vocab >= 51865 means multilingual


def timestamp_text(index: int) -> str:
    return f"<|{index * TIME_PRECISION:.2f}|>"


def build_tokenizer_json(
    src: Path, fmt: str, tokenizer_dir: Path | None = None, n_vocab: int | None = None
) -> dict:
    """A complete `tokenizers` JSON for the checkpoint at ``src`` (format ``fmt``: ctranslate2, huggingface
    or openai), with ``<|0.00|>`` ... ``<|30.00|>`` as special added tokens right after ``<|notimestamps|>``.

    ``tokenizer_dir`` overrides where the tokenizer files are read from (required for ``.pt`` files).
    ``n_vocab``, when known (the embedding's row count), must equal the resulting vocabulary size.
    """
    src = Path(src)
    if tokenizer_dir is None:
        if fmt == "openai":
            raise ModelError(
                f"{src}: an OpenAI .pt checkpoint holds no tokenizer; pass a tokenizer directory "
                "(a Hugging Face or CTranslate2 model directory of the same model family)"
            )
        tokenizer_dir = src
    tokenizer_dir = Path(tokenizer_dir)
    if not tokenizer_dir.is_dir():
        raise ModelError(f"{tokenizer_dir}: not a tokenizer directory")

    if (tokenizer_dir / "vocabulary.txt").is_file() or (tokenizer_dir / "vocabulary.json").is_file():
        tok = _from_ctranslate2_dir(tokenizer_dir)
    elif (tokenizer_dir / "tokenizer.json").is_file() or (tokenizer_dir / "vocab.json").is_file():
        tok = _from_huggingface_dir(tokenizer_dir)
    else:
        raise ModelError(
            f"{tokenizer_dir}: no tokenizer found (expected tokenizer.json, vocab.json + merges.txt, "
            "or vocabulary.txt)"
        )

    size = _vocab_size(tok)
    if n_vocab is not None and size != n_vocab:
        raise ModelError(
            f"{tokenizer_dir}: the tokenizer has {size} tokens but the model's embedding has {n_vocab} rows"
        )
    return tok


def tokenizer_from_json(tok: dict) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_str(json.dumps(tok))


def special_tokens(tok: dict) -> dict[str, int]:
    """The ids of Whisper's special tokens, keyed as in ``whisperane.tokenizer.SPECIAL_TOKEN_KEYS``."""
    ids = _token_ids(tok)
    result: dict[str, int] = {}
    for key, texts in _SPECIAL_TEXT.items():
        found = [ids[text] for text in texts if text in ids]
        if not found:
            raise ModelError(f"the tokenizer lacks Whisper's special token {texts[0]}")
        result[key] = found[0]
    result["timestamp_begin"] = result["no_timestamps"] + 1
    return {key: result[key] for key in SPECIAL_TOKEN_KEYS}


def is_multilingual(tok: dict) -> bool:
    return _vocab_size(tok) >= MULTILINGUAL_MIN_VOCAB


def languages(tok: dict, multilingual: bool | None = None) -> dict[str, int]:
    """``{code: token id}`` in Whisper's LANGUAGES order: the languages the vocabulary holds for a
    multilingual model (99, or 100 with yue for large-v3); only ``en`` for an English-only model."""
    if multilingual is None:
        multilingual = is_multilingual(tok)
    ids = _token_ids(tok)
    special = special_tokens(tok)
    found = {code: ids[f"<|{code}|>"] for code in LANGUAGES if f"<|{code}|>" in ids}
    if not multilingual:
        return {"en": found["en"]} if "en" in found else {}
    # The language tokens are contiguous, right after <|startoftranscript|>, in LANGUAGES order.
    expected = range(special["sot"] + 1, special["translate"])
    if list(found.values()) != list(expected):
        raise ModelError(
            "the tokenizer's language tokens do not follow <|startoftranscript|> in Whisper's order"
        )
    return found


def suppress_tokens(tok: dict, backend: tokenizers.Tokenizer | None = None) -> list[int]:
    """openai-whisper's default ``suppress_tokens="-1"``: the non-speech symbols plus the task, start and
    no-speech tokens (CTranslate2 stores the same list as ``suppress_ids``)."""
    special = special_tokens(tok)
    backend = backend or tokenizer_from_json(tok)
    symbols = non_speech_tokens(lambda text: backend.encode(text, add_special_tokens=False).ids)
    extra = [special[key] for key in ("translate", "transcribe", "sot", "sot_prev", "sot_lm", "no_speech")]
    return sorted(set(symbols) | set(extra))


def suppress_blank_tokens(tok: dict, backend: tokenizers.Tokenizer | None = None) -> list[int]:
    """Tokens suppressed at the first sampled position (openai-whisper's suppress_blank): " " and eot."""
    backend = backend or tokenizer_from_json(tok)
    return [*backend.encode(" ", add_special_tokens=False).ids, special_tokens(tok)["eot"]]


def token_config(tok: dict, multilingual: bool | None = None) -> dict:
    """Everything about tokens that the bundle's config.json records."""
    if multilingual is None:
        multilingual = is_multilingual(tok)
    backend = tokenizer_from_json(tok)
    return {
        "multilingual": multilingual,
        "n_vocab": _vocab_size(tok),
        "special_tokens": special_tokens(tok),
        "languages": languages(tok, multilingual),
        "suppress_tokens": suppress_tokens(tok, backend),
        "suppress_blank_tokens": suppress_blank_tokens(tok, backend),
    }


# --- sources -----------------------------------------------------------------------------------------------


def _from_ctranslate2_dir(src: Path) -> dict:
    vocabulary = _read_ct2_vocabulary(src)
    if not (src / "tokenizer.json").is_file():
        raise ModelError(f"{src}: tokenizer.json is missing")
    tok = _load_json(src / "tokenizer.json")

    # The shipped tokenizer.json must agree with vocabulary.txt on every id it has; vocabulary.txt then
    # supplies the rest (the timestamp tokens).
    backend = tokenizer_from_json(tok)
    known = backend.get_vocab(with_added_tokens=True)
    for text, index in sorted(known.items(), key=lambda item: item[1]):
        if index >= len(vocabulary) or vocabulary[index] != text:
            line = vocabulary[index] if index < len(vocabulary) else "<missing>"
            raise ModelError(
                f"{src}: tokenizer.json and the vocabulary file disagree at id {index} ({text!r} vs {line!r})"
            )
    no_timestamps = known.get("<|notimestamps|>")
    if no_timestamps is None:
        raise ModelError(f"{src}: tokenizer.json lacks <|notimestamps|>")
    for index in range(N_TIMESTAMPS):
        token_id = no_timestamps + 1 + index
        if token_id >= len(vocabulary) or vocabulary[token_id] != timestamp_text(index):
            raise ModelError(
                f"{src}: the vocabulary file does not list {timestamp_text(index)} at id {token_id}"
            )
    if len(vocabulary) != no_timestamps + 1 + N_TIMESTAMPS:
        raise ModelError(
            f"{src}: the vocabulary file has {len(vocabulary)} entries, expected "
            f"{no_timestamps + 1 + N_TIMESTAMPS} (<|30.00|> last)"
        )
    return _with_timestamps(tok, src)


def _read_ct2_vocabulary(src: Path) -> list[str]:
    if (src / "vocabulary.json").is_file():
        vocabulary = _load_json(src / "vocabulary.json")
        if not isinstance(vocabulary, list) or not all(isinstance(t, str) for t in vocabulary):
            raise ModelError(f"{src / 'vocabulary.json'}: not a list of tokens")
        return vocabulary
    path = src / "vocabulary.txt"
    text = path.read_text(encoding="utf-8")
    # One token per line; line N is id N. Some lines are empty (the multilingual vocabulary's id 50256 is
    # the empty string), so split on "\n" only and drop just the final terminator: never strip or skip.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _from_huggingface_dir(src: Path) -> dict:
    if (src / "tokenizer.json").is_file():
        tok = _load_json(src / "tokenizer.json")
    else:
        tok = _assemble_from_vocab_and_merges(src)
    # Slow-tokenizer directories keep further added tokens (timestamps in some revisions) outside.
    added_path = src / "added_tokens.json"
    if added_path.is_file():
        present = {entry["content"] for entry in tok.get("added_tokens", [])}
        for text, index in sorted(_load_json(added_path).items(), key=lambda item: item[1]):
            if text not in present:
                tok["added_tokens"].append(_added_token(index, text))
    return _with_timestamps(tok, src)


def _assemble_from_vocab_and_merges(src: Path) -> dict:
    vocab_path, merges_path = src / "vocab.json", src / "merges.txt"
    if not merges_path.is_file():
        raise ModelError(f"{src}: vocab.json without merges.txt")
    vocab = _load_json(vocab_path)
    merges = []
    for line in merges_path.read_text(encoding="utf-8").split("\n"):
        if line and not line.startswith("#version"):
            left, _, right = line.partition(" ")
            merges.append((left, right))
    model = tokenizers.models.BPE(vocab=vocab, merges=merges)
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    tok = json.loads(backend.to_str())
    tok["added_tokens"] = []
    return tok


def _with_timestamps(tok: dict, src: Path) -> dict:
    """A copy of ``tok`` with every timestamp token registered right after <|notimestamps|>."""
    tok = json.loads(json.dumps(tok))  # a deep copy, faster than copy.deepcopy on plain JSON data
    added = tok.setdefault("added_tokens", [])
    ids = _token_ids(tok)
    taken = set(ids.values())
    if "<|notimestamps|>" not in ids:
        raise ModelError(f"{src}: the tokenizer lacks <|notimestamps|>")
    begin = ids["<|notimestamps|>"] + 1
    for index in range(N_TIMESTAMPS):
        text, token_id = timestamp_text(index), begin + index
        if text in ids:
            if ids[text] != token_id:
                raise ModelError(f"{src}: {text} has id {ids[text]}, expected {token_id}")
            continue
        if token_id in taken:
            raise ModelError(f"{src}: id {token_id} is taken, cannot place {text} there")
        added.append(_added_token(token_id, text))
    added.sort(key=lambda entry: entry["id"])

    # Check the result the way it will be used: the library must give every timestamp the intended id.
    backend = tokenizer_from_json(tok)
    for index in (0, 1, N_TIMESTAMPS - 1):
        if backend.token_to_id(timestamp_text(index)) != begin + index:
            raise ModelError(f"{src}: the tokenizer does not map {timestamp_text(index)} to {begin + index}")
    return tok


def _added_token(token_id: int, text: str) -> dict:
    return {
        "id": int(token_id),
        "content": text,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _token_ids(tok: dict) -> dict[str, int]:
    ids = dict(tok.get("model", {}).get("vocab", {}))
    for entry in tok.get("added_tokens", []):
        ids[entry["content"]] = entry["id"]
    return ids


def _vocab_size(tok: dict) -> int:
    return max(_token_ids(tok).values()) + 1


def _load_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path}: cannot read JSON: {err}") from err
