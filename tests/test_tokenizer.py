"""The bundle tokenizer (build side) and the run-side Tokenizer, checked against the shipped files of real
checkpoints, faster-whisper's tokenizer and transformers' language tables."""

from __future__ import annotations

import functools
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from faster_whisper.tokenizer import Tokenizer as FasterWhisperTokenizer

from whisperane.convert.tokenizer_build import (
    build_tokenizer_json,
    languages,
    special_tokens,
    suppress_blank_tokens,
    suppress_tokens,
    token_config,
    tokenizer_from_json,
)
from whisperane.errors import ModelError, WhisperaneError
from whisperane.tokenizer import LANGUAGES, TO_LANGUAGE_CODE, Tokenizer

EXTRA_TEXTS = {
    "en": [
        "Hello world! It's 3:45 p.m. -- isn't it?  Double  spaces, tabs\tand\nnewlines.",
        "Prices rose 12.5% (from $1,000 to $1,125) [citation needed] {braces} <angle> ♪♪ la la ♪",
        "naïve café résumé — “curly quotes” and ‘single’ ones…",
    ],
    "zh": ["我们今天去公园散步，天气很好。", "广州市房地产中介协会分析"],
    "ja": ["東京は日本の首都です。「こんにちは」と言った。"],
    "ko": ["안녕하세요, 만나서 반갑습니다!"],
    "ru": ["Съешь же ещё этих мягких французских булок, да выпей чаю."],
    "th": ["สวัสดีครับ ยินดีที่ได้รู้จัก"],
    "ar": ["مرحبا بالعالم"],
    "el": ["Γειά σου Κόσμε"],
    "hi": ["नमस्ते दुनिया"],
}


def read_ct2_shapes(model_bin: Path) -> dict[str, tuple[int, ...]]:
    """Variable shapes from a CTranslate2 model.bin header (docs/DESIGN.md §4), skipping the data."""
    shapes = {}
    with open(model_bin, "rb") as f:

        def string() -> str:
            (length,) = struct.unpack("<H", f.read(2))
            return f.read(length)[:-1].decode()

        f.read(4)  # version
        string()  # spec
        f.read(4)  # revision
        (count,) = struct.unpack("<I", f.read(4))
        for _ in range(count):
            name = string()
            (rank,) = struct.unpack("<B", f.read(1))
            dims = struct.unpack(f"<{rank}I", f.read(4 * rank))
            f.read(1)  # dtype
            (nbytes,) = struct.unpack("<I", f.read(4))
            f.seek(nbytes, 1)
            shapes[name] = dims
    return shapes


def vocabulary_lines(ct2_dir: Path) -> list[str]:
    lines = (ct2_dir / "vocabulary.txt").read_bytes().decode("utf-8").split("\n")
    assert lines[-1] == ""
    return lines[:-1]


@functools.cache
def built_tokenizer(ct2_dir: Path) -> dict:
    return build_tokenizer_json(ct2_dir, "ctranslate2")


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def checkpoint(request, ct2_tiny_en_dir, ct2_base_dir):
    ct2_dir = ct2_tiny_en_dir if request.param == "tiny.en" else ct2_base_dir
    tok = built_tokenizer(ct2_dir)
    return {
        "name": request.param,
        "dir": ct2_dir,
        "tok": tok,
        "backend": tokenizer_from_json(tok),
        "shipped": tokenizers.Tokenizer.from_file(str(ct2_dir / "tokenizer.json")),
        "config": json.loads((ct2_dir / "config.json").read_text()),
        "multilingual": request.param == "base",
    }


@pytest.fixture(scope="module")
def texts(corpus_manifest) -> list[tuple[str, str]]:
    corpus = [(entry["language"], entry["text"]) for entry in corpus_manifest]
    extra = [(lang, text) for lang, items in EXTRA_TEXTS.items() for text in items]
    return corpus + extra


# --- build side ------------------------------------------------------------------------------------------


def test_vocab_size_matches_model_embedding(checkpoint):
    shapes = read_ct2_shapes(checkpoint["dir"] / "model.bin")
    n_vocab = shapes["decoder/embeddings/weight"][0]
    assert n_vocab == {"tiny.en": 51864, "base": 51865}[checkpoint["name"]]
    assert checkpoint["backend"].get_vocab_size(with_added_tokens=True) == n_vocab
    assert len(vocabulary_lines(checkpoint["dir"])) == n_vocab
    assert token_config(checkpoint["tok"])["n_vocab"] == n_vocab
    # the build rejects a model whose embedding does not fit the tokenizer
    with pytest.raises(ModelError, match="rows"):
        build_tokenizer_json(checkpoint["dir"], "ctranslate2", n_vocab=n_vocab + 1)


def test_every_id_matches_vocabulary_txt_line(checkpoint):
    backend = checkpoint["backend"]
    lines = vocabulary_lines(checkpoint["dir"])
    mismatches = [i for i, line in enumerate(lines) if backend.id_to_token(i) != line]
    assert mismatches == []
    if checkpoint["multilingual"]:
        # the empty line is a real (unreachable) vocabulary entry, the empty string, at id 50256
        assert lines[50256] == "" and backend.token_to_id("") == 50256
        assert backend.decode([50256]) == ""


def test_timestamp_tokens_follow_notimestamps(checkpoint):
    backend, special = checkpoint["backend"], special_tokens(checkpoint["tok"])
    no_timestamps = backend.token_to_id("<|notimestamps|>")
    assert special["no_timestamps"] == no_timestamps
    assert special["timestamp_begin"] == no_timestamps + 1
    assert backend.token_to_id("<|0.00|>") == no_timestamps + 1
    assert backend.token_to_id("<|1.08|>") == no_timestamps + 1 + 54
    assert backend.token_to_id("<|30.00|>") == no_timestamps + 1501
    # the shipped tokenizer.json lacks them: that is why the bundle needs its own
    assert checkpoint["shipped"].token_to_id("<|0.00|>") is None


def test_text_encodes_and_decodes_like_the_shipped_tokenizer(checkpoint, texts):
    backend, shipped = checkpoint["backend"], checkpoint["shipped"]
    for _, text in texts:
        ids = backend.encode(text, add_special_tokens=False).ids
        assert ids == shipped.encode(text, add_special_tokens=False).ids
        assert backend.decode(ids) == shipped.decode(ids) == text


def test_special_tokens_match_faster_whisper(checkpoint):
    fw = FasterWhisperTokenizer(checkpoint["shipped"], checkpoint["multilingual"], "transcribe", "en")
    expected = {
        "eot": fw.eot,
        "sot": fw.sot,
        "sot_prev": fw.sot_prev,
        "sot_lm": fw.sot_lm,
        "no_speech": fw.no_speech,
        "no_timestamps": fw.no_timestamps,
        "timestamp_begin": fw.timestamp_begin,
        "transcribe": fw.transcribe,
        "translate": fw.translate,
    }
    assert special_tokens(checkpoint["tok"]) == expected


def test_languages_follow_whisper_order(checkpoint):
    langs = languages(checkpoint["tok"])
    backend = checkpoint["backend"]
    if checkpoint["multilingual"]:
        # base predates yue: the first 99 of transformers' table, with CTranslate2's language ids
        from transformers.models.whisper.tokenization_whisper import LANGUAGES as HF_LANGUAGES

        assert list(langs) == [code for code in HF_LANGUAGES if code != "yue"]
        assert list(langs.values()) == checkpoint["config"]["lang_ids"]
        assert all(backend.token_to_id(f"<|{code}|>") == token for code, token in langs.items())
    else:
        assert langs == {"en": backend.token_to_id("<|en|>")}


def test_suppress_tokens_match_ctranslate2_config(checkpoint):
    assert suppress_tokens(checkpoint["tok"]) == checkpoint["config"]["suppress_ids"]
    assert suppress_blank_tokens(checkpoint["tok"]) == checkpoint["config"]["suppress_ids_begin"]


def test_ct2_vocabulary_with_dropped_empty_line_is_rejected(ct2_base_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(ct2_base_dir / name, broken / name)
    lines = vocabulary_lines(ct2_base_dir)
    del lines[50256]  # what a splitlines()/strip() reader would do
    (broken / "vocabulary.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ModelError, match="disagree at id 50256"):
        build_tokenizer_json(broken, "ctranslate2")


def _hf_dir_from(ct2_dir: Path, dest: Path, with_tokenizer_json: bool) -> Path:
    """A Hugging Face style tokenizer directory holding the same vocabulary."""
    dest.mkdir()
    shipped = json.loads((ct2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    (dest / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    if with_tokenizer_json:
        shutil.copy(ct2_dir / "tokenizer.json", dest / "tokenizer.json")
    else:
        model = shipped["model"]
        (dest / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        (dest / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
        added = {entry["content"]: entry["id"] for entry in shipped["added_tokens"]}
        (dest / "added_tokens.json").write_text(json.dumps(added), encoding="utf-8")
    return dest


@pytest.mark.parametrize("with_tokenizer_json", [True, False], ids=["tokenizer.json", "vocab+merges"])
def test_huggingface_dir_builds_the_same_tokenizer(checkpoint, texts, tmp_path, with_tokenizer_json):
    hf_dir = _hf_dir_from(checkpoint["dir"], tmp_path / "hf", with_tokenizer_json)
    tok = build_tokenizer_json(hf_dir, "huggingface")
    backend = tokenizer_from_json(tok)
    reference = checkpoint["backend"]
    assert backend.get_vocab(with_added_tokens=True) == reference.get_vocab(with_added_tokens=True)
    assert token_config(tok) == token_config(checkpoint["tok"])
    for _, text in texts[:12] + texts[-8:]:
        ids = backend.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text, add_special_tokens=False).ids
        assert backend.decode(ids) == text


def test_openai_checkpoint_needs_a_tokenizer_dir(ct2_tiny_en_dir, tmp_path):
    pt = tmp_path / "tiny.en.pt"
    pt.write_bytes(b"not read")
    with pytest.raises(ModelError, match="holds no tokenizer"):
        build_tokenizer_json(pt, "openai")
    tok = build_tokenizer_json(pt, "openai", tokenizer_dir=ct2_tiny_en_dir, n_vocab=51864)
    assert tokenizer_from_json(tok).token_to_id("<|30.00|>") == 51863


# --- run side --------------------------------------------------------------------------------------------


def _runtime_tokenizer(checkpoint, tmp_path, language, task="transcribe") -> Tokenizer:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(checkpoint["tok"]), encoding="utf-8")
    config = token_config(checkpoint["tok"])
    return Tokenizer.from_files(
        path, config["special_tokens"], config["languages"], config["multilingual"], language, task
    )


def _faster_whisper_tokenizer(checkpoint, language, task="transcribe"):
    # faster-whisper decodes timestamps itself, so the shipped tokenizer.json is its complete input
    return FasterWhisperTokenizer(checkpoint["shipped"], checkpoint["multilingual"], task, language)


def test_runtime_tokenizer_matches_faster_whisper(checkpoint, texts, tmp_path):
    by_language: dict[str, list[str]] = {}
    for lang, text in texts:
        if checkpoint["multilingual"] or lang == "en":
            by_language.setdefault(lang, []).append(text)
    loaded = _runtime_tokenizer(checkpoint, tmp_path, None)
    for lang, items in by_language.items():
        ours = loaded.with_language(lang)
        ref = _faster_whisper_tokenizer(checkpoint, lang)
        assert ours.sot_sequence == tuple(ref.sot_sequence)
        assert ours.sot_sequence_including_notimestamps == (*ref.sot_sequence, ref.no_timestamps)
        assert ours.timestamp_begin == ref.timestamp_begin
        for text in items:
            ids = ours.encode(text)
            assert ids == ref.encode(text)
            assert ours.decode(ids) == ref.decode(ids) == text
            # what the decoder produces: timestamps around the text, then eot
            tokens = [ours.timestamp_begin, *ids, ours.timestamp_begin + 54, ours.eot]
            assert ours.decode(tokens) == text
            assert ours.decode_with_timestamps(tokens) == ref.decode_with_timestamps(tokens)
            assert ours.decode_with_timestamps(tokens) == f"<|0.00|>{text}<|1.08|>"
            if len(text) < 250:  # quadratic in the token count, in both implementations
                assert ours.split_to_word_tokens(ids + [ours.eot]) == ref.split_to_word_tokens(
                    ids + [ours.eot]
                )


def test_decoding_matches_the_tokenizers_byte_level_decoder(checkpoint, tmp_path, monkeypatch):
    """The run side decodes from a byte table without `tokenizers`: every token alone, and random sequences
    (which cut multi-byte characters, so the U+FFFD replacement rule is exercised), decode as `tokenizers` does."""
    loaded = []

    class Unused:  # `tokenizers.Tokenizer` while our tokenizer is made and decodes: the run side's load refused
        from_str = staticmethod(tokenizers.Tokenizer.from_str)  # the build side's (token_config)

        @staticmethod
        def from_file(path):
            loaded.append(path)
            raise AssertionError("decoding loaded `tokenizers`")

    monkeypatch.setattr(tokenizers, "Tokenizer", Unused)
    ours = _runtime_tokenizer(checkpoint, tmp_path, "en")
    ref = checkpoint["shipped"]
    n = ours.eot
    singles = [ours.decode([t]) for t in range(n)]
    assert singles == ref.decode_batch([[t] for t in range(n)], skip_special_tokens=False)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, n, size=rng.integers(1, 40)).tolist() for _ in range(2000)]
    assert [ours.decode(s) for s in sequences] == ref.decode_batch(sequences, skip_special_tokens=False)
    assert any("\ufffd" in ours.decode(s) for s in sequences)
    assert loaded == []  # decoding never loaded `tokenizers`


def test_the_token_table_is_kept_beside_the_json(checkpoint, tmp_path, monkeypatch):
    """The first load keeps the token table beside tokenizer.json; later loads read it and decode every token as the
    JSON does; a damaged table is rebuilt, a changed JSON gets a table of its own (the old one removed), and a
    directory that cannot be written still loads."""
    from whisperane.token_table import TABLE_PREFIX
    from whisperane.tokenizer import Vocabulary

    first = _runtime_tokenizer(checkpoint, tmp_path, "en")
    (kept,) = tmp_path.glob(f"{TABLE_PREFIX}*.bin")
    path = tmp_path / "tokenizer.json"
    from_json = first.vocabulary._table_from_json(path.read_bytes())
    assert first.vocabulary.token_bytes == from_json and Vocabulary(path).token_bytes == from_json
    whole = kept.read_bytes()
    kept.write_bytes(whole[:-3])  # cut short
    assert Vocabulary(path).token_bytes == from_json and kept.read_bytes() == whole  # rebuilt
    changed = dict(checkpoint["tok"], model=dict(checkpoint["tok"]["model"], vocab={"a": 0, "Ġb": 1}))
    path.write_text(json.dumps(changed), encoding="utf-8")
    assert Vocabulary(path).token_bytes == [b"a", b" b"]
    assert [p.name for p in tmp_path.glob(f"{TABLE_PREFIX}*.bin")] != [kept.name]
    def refused(path, write):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("whisperane.token_table.atomic_write", refused)  # a read-only bundle (even as root)
    other = tmp_path / "read-only"
    other.mkdir()
    (other / "tokenizer.json").write_text(json.dumps(changed), encoding="utf-8")
    assert Vocabulary(other / "tokenizer.json").token_bytes == [b"a", b" b"] and not list(other.glob("*.bin"))


def test_word_splitting_by_script(ct2_base_dir, tmp_path):
    checkpoint = {"tok": built_tokenizer(ct2_base_dir)}
    zh = _runtime_tokenizer(checkpoint, tmp_path, "zh")
    text = "我们今天去公园散步"
    words, word_tokens = zh.split_to_word_tokens(zh.encode(text))
    # per character where tokens allow it, never a partial UTF-8 sequence, and nothing lost
    assert "".join(words) == text and "\ufffd" not in "".join(words)
    assert sum(word_tokens, []) == zh.encode(text)
    assert len(words) >= 5
    en = _runtime_tokenizer(checkpoint, tmp_path, "en")
    words, _ = en.split_to_word_tokens(en.encode(" Hello, wonderful world."))
    assert words == [" Hello", ",", " wonderful", " world", "."]


def test_non_speech_tokens_match_faster_whisper(checkpoint, tmp_path):
    ours = _runtime_tokenizer(checkpoint, tmp_path, "en")
    assert ours.non_speech_tokens == _faster_whisper_tokenizer(checkpoint, "en").non_speech_tokens


def test_language_selection(checkpoint, tmp_path):
    if checkpoint["multilingual"]:
        tok = _runtime_tokenizer(checkpoint, tmp_path, "German", task="translate")
        assert tok.language == "de"
        assert tok.sot_sequence == (tok.sot, tok.to_language_token("de"), tok.translate)
        assert tok.all_language_codes[:3] == ("en", "zh", "de")
        assert tok.all_language_tokens == tuple(range(tok.sot + 1, tok.translate))
        undetected = tok.with_language(None)
        assert undetected.sot_sequence == (tok.sot, tok.translate)
        with pytest.raises(ModelError, match="yue"):
            tok.with_language("yue")  # cantonese arrived with large-v3
    else:
        tok = _runtime_tokenizer(checkpoint, tmp_path, None)
        assert tok.language == "en" and tok.sot_sequence == (tok.sot,)
    with pytest.raises(WhisperaneError, match="unknown language 'klingon'"):
        tok.with_language("klingon")
    with pytest.raises(WhisperaneError, match="unknown task"):
        tok.with_language("en", task="summarize")


def test_language_tables_match_transformers():
    from transformers.models.whisper import tokenization_whisper as hf

    assert list(LANGUAGES.items()) == list(hf.LANGUAGES.items())
    assert TO_LANGUAGE_CODE == hf.TO_LANGUAGE_CODE
