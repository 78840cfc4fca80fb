"""Model names that resolve through the Hugging Face hub (``small``, ``large-v3-turbo``, ``distil-large-v3``),
run offline: the hub is unreachable here, so the tests fill a cache in the hub's on-disk layout
(``models--<owner>--<name>/{refs/main, snapshots/<commit>/, blobs/}``) with small randomly initialised
Whispers written by transformers (a multilingual and an English-only one), and point ``HF_HUB_CACHE`` at it
with ``HF_HUB_OFFLINE=1``.
With an empty cache the name must fail with one line that names the fix: a local checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import CLIPS

import whisperane
from whisperane import command as cli
from whisperane.convert.sources import HUB_MODELS, resolve_source
from whisperane.errors import ModelError
from whisperane.result import TranscriptionResult

# Any 40 hex digits: the hub names snapshots by commit.
HUB_COMMIT = "5f7b2c9a1e3d4f6a8b0c2d4e6f8a0b1c3d5e7f90"
# The MLPs are 4 x d_model wide, as in every Whisper (the converter derives their width from d_model).
RANDOM_WHISPER = dict(
    d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=256, decoder_ffn_dim=256, num_mel_bins=80, max_target_positions=64,
)
ALIGNMENT_HEADS = [[0, 1], [0, 0]]
HUB_NAMES = {"small": "multilingual", "large-v3-turbo": "multilingual", "distil-large-v3": "multilingual",
             "small.en": "english"}


def multilingual_tokenizer(english: dict) -> dict:
    """Whisper's multilingual id layout built from the English tokenizer.json (the hub is unreachable, so no
    multilingual one can be fetched): the same 50256 byte-level BPE tokens, id 50256 the empty token as in
    the multilingual vocabulary, and every special token one id later (<|endoftext|> 50257, languages from
    50259, <|notimestamps|> 50363). Random weights make the text meaningless; the ids are what is tested."""
    tok = json.loads(json.dumps(english))
    vocab = tok["model"]["vocab"]
    eot = vocab.pop("<|endoftext|>")
    assert eot == 50256 and max(vocab.values()) == eot - 1
    vocab[""] = eot
    for entry in tok["added_tokens"]:
        entry["id"] += 1
        # Hebrew as openai's tokenizer spells it; the English Hugging Face files keep the old code <|iw|>.
        if entry["content"] == "<|iw|>":
            entry["content"] = "<|he|>"
    for special in tok["post_processor"]["special_tokens"].values():
        special["ids"] = [i + 1 for i in special["ids"]]
    return tok


def write_random_checkpoint(path: Path, tokenizer: dict, vocab_size: int) -> None:
    """What the converter fetches from a hub snapshot of a Whisper repo (sources._HUB_PATTERNS): config.json,
    generation_config.json with the alignment heads, model.safetensors, tokenizer.json."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(WhisperConfig(**RANDOM_WHISPER, vocab_size=vocab_size)).eval()
    model.generation_config.alignment_heads = ALIGNMENT_HEADS
    model.save_pretrained(path, safe_serialization=True)
    (path / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")


def add_to_hub_cache(cache: Path, repo_id: str, files: Path) -> Path:
    """``files`` as the snapshot ``HUB_COMMIT`` of ``repo_id`` in a hub cache: content-addressed blobs, the
    snapshot's files linked to them, and refs/main naming the commit. Returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / HUB_COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(files.iterdir()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HUB_COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, ct2_tiny_en_dir) -> dict[str, Path]:
    """Random checkpoints: "multilingual" (n_vocab 51865) and "english" (51864, tiny.en's own tokenizer)."""
    english = json.loads((ct2_tiny_en_dir / "tokenizer.json").read_text(encoding="utf-8"))
    root = tmp_path_factory.mktemp("random-whisper")
    write_random_checkpoint(root / "multilingual", multilingual_tokenizer(english), vocab_size=51865)
    write_random_checkpoint(root / "english", english, vocab_size=51864)
    return {"multilingual": root / "multilingual", "english": root / "english"}


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory, checkpoints) -> Path:
    cache = tmp_path_factory.mktemp("hf-hub-cache")
    for name, kind in HUB_NAMES.items():
        add_to_hub_cache(cache, HUB_MODELS[name], checkpoints[kind])
    return cache


def offline_hub(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """HF_HUB_OFFLINE=1 and the hub cache at ``cache``; huggingface_hub reads both when it is imported, so its
    constants are set too (this process may have imported it already)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))


@pytest.mark.parametrize(
    "name, repo_id",
    [("small", "openai/whisper-small"), ("large-v3-turbo", "openai/whisper-large-v3-turbo"),
     ("distil-large-v3", "distil-whisper/distil-large-v3"), ("small.en", "openai/whisper-small.en")],
)
def test_hub_name_resolves_offline_from_the_cache(name, repo_id, filled_cache, checkpoints, monkeypatch):
    offline_hub(monkeypatch, filled_cache)
    resolved = resolve_source(name, progress=False)
    assert resolved.format == "huggingface" and resolved.origin == f"hf:{repo_id}"
    snapshot = filled_cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / HUB_COMMIT
    assert resolved.path == snapshot
    weights = (checkpoints[HUB_NAMES[name]] / "model.safetensors").read_bytes()
    assert resolved.sha256 == hashlib.sha256(weights).hexdigest()


def test_multilingual_hub_snapshot_reads_as_whisper_multilingual(filled_cache, monkeypatch):
    """What the converter reads from ``small``'s snapshot: multilingual dimensions, the alignment heads of
    generation_config.json, Whisper's multilingual token layout. (Converting it computes the prefill table
    for 99 languages x 2 tasks, over a minute on two busy cores: the conversion test uses an English name.)"""
    from whisperane.convert.checkpoint import load_checkpoint
    from whisperane.convert.tokenizer_build import build_tokenizer_json, token_config

    offline_hub(monkeypatch, filled_cache)
    resolved = resolve_source("small", progress=False)
    checkpoint = load_checkpoint(resolved.path, resolved.format)
    assert checkpoint.dims.is_multilingual and checkpoint.dims.n_vocab == 51865
    assert checkpoint.dims.n_text_state == RANDOM_WHISPER["d_model"]
    assert [list(h) for h in checkpoint.alignment_heads] == ALIGNMENT_HEADS
    tokens = token_config(
        build_tokenizer_json(resolved.path, resolved.format, n_vocab=checkpoint.dims.n_vocab)
    )
    assert tokens["multilingual"] and tokens["n_vocab"] == 51865
    special = tokens["special_tokens"]
    assert (special["eot"], special["sot"], special["translate"], special["transcribe"]) == (
        50257,
        50258,
        50358,
        50359,
    )
    assert (special["no_timestamps"], special["timestamp_begin"]) == (50363, 50364)
    assert len(tokens["languages"]) == 99 and list(tokens["languages"].values()) == list(range(50259, 50358))


@pytest.mark.slow
def test_hub_name_converts_loads_and_transcribes(filled_cache, monkeypatch, tmp_path):
    """``small.en`` from the cache, converted (ONNX), loaded and run on real speech. The weights are random,
    so the structure is asserted, not the text."""
    from whisperane.convert.pipeline import convert

    offline_hub(monkeypatch, filled_cache)
    bundle = convert("small.en", out_dir=tmp_path / "small.en")
    config = json.loads((bundle / "config.json").read_text())
    assert config["source"]["origin"] == "hf:openai/whisper-small.en"
    assert not config["multilingual"] and config["n_vocab"] == 51864
    assert config["dims"]["n_text_state"] == RANDOM_WHISPER["d_model"]
    assert config["alignment_heads"] == ALIGNMENT_HEADS

    clip = CLIPS["jfk"]
    result = whisperane.transcribe(clip.path, model=whisperane.load_model(bundle), temperature=0.0)
    assert isinstance(result, TranscriptionResult)
    assert result.language == "en"
    assert result.duration == pytest.approx(11.0, abs=0.01)
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    for segment in result.segments:
        assert 0.0 <= segment.start <= segment.end <= result.duration + 1e-6
        assert all(0 <= t < config["n_vocab"] for t in segment.tokens)
        assert segment.words is not None  # word timestamps (the default) ran on the alignment heads
    json.dumps(result.to_dict(), allow_nan=False)


def test_hub_name_without_cache_or_network_is_one_line_naming_a_local_path(tmp_path, monkeypatch, capsys):
    offline_hub(monkeypatch, tmp_path / "empty-hub-cache")
    monkeypatch.setenv("WHISPERANE_MODELS", str(tmp_path / "models"))
    out = tmp_path / "out"
    code = cli.main(["transcribe", str(CLIPS["jfk"].path), "--model", "small", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith("whisperane: error: ") and "Traceback" not in err
    assert "openai/whisper-small" in line and "HF_HUB_OFFLINE" in line
    assert "--local-dir whisper-small" in line and "`./whisper-small` as the model" in line  # a local path
    assert not (tmp_path / "models").exists() and not [p for p in out.rglob("*") if p.is_file()]


def test_partial_snapshot_in_the_cache_is_not_taken_for_the_model(checkpoints, tmp_path, monkeypatch):
    """A snapshot holding only the configs (another tool fetched config.json, or a download was cut) is no
    checkpoint: offline, the name fails as if nothing were cached, with the same fix."""
    configs_only = tmp_path / "configs"
    configs_only.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(checkpoints["multilingual"] / name, configs_only / name)
    add_to_hub_cache(tmp_path / "cache", "openai/whisper-small", configs_only)
    offline_hub(monkeypatch, tmp_path / "cache")
    with pytest.raises(ModelError) as error:
        resolve_source("small", progress=False)
    message = str(error.value)
    assert "is not in the Hugging Face cache" in message and "local checkpoint" in message
