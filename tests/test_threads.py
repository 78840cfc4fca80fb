"""One loaded model, several threads: each call holds its own decoder state, so transcripts from threads in
parallel are those of the same calls one after another (the wall time is measured by
``benchmarks/bench_decoding.py --only threads``, benchmarks/results/2026-12-01-decoding.md §3, not asserted
here)."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import CORPUS_DIR, DATA_DIR

import whisperane

# Four different English clips: from the corpus when it is beside the checkout, else from tests/data.
CORPUS_FILES = [
    "audio/openai__whisper/jfk.flac",
    "audio/KennethWang1221__Speech2Text/1089-134686-0000.flac",
    "audio/coqui-ai__TTS/LJ001-0001.flac",
    "audio/lhotse-speech__lhotse/2412-153948-0000.flac",
]
DATA_FILES = ["jfk.flac", "1089-134691-0001.flac", "LJ001-0002.flac", "1089-134686-0001.flac"]


def four_files() -> list[str]:
    corpus = [CORPUS_DIR / f for f in CORPUS_FILES]
    if all(p.is_file() for p in corpus):
        return [str(p) for p in corpus]
    return [str(DATA_DIR / f) for f in DATA_FILES]


@pytest.fixture(scope="module")
def one_thread_model(tiny_en_bundle):
    return whisperane.load_model(tiny_en_bundle, threads=1)


@pytest.fixture(scope="module")
def sequential(one_thread_model):
    return [one_thread_model.transcribe(f).to_dict() for f in four_files()]


@pytest.mark.parametrize("n_threads", [2, 4])
def test_threads_on_one_model_give_the_sequential_transcripts(one_thread_model, sequential, n_threads):
    files = four_files()[:n_threads]
    with ThreadPoolExecutor(n_threads) as pool:
        parallel = list(pool.map(lambda f: one_thread_model.transcribe(f).to_dict(), files))
    assert [p["text"] for p in parallel] == [s["text"] for s in sequential[:n_threads]]
    assert parallel == sequential[:n_threads]  # segments, tokens, word times and probabilities too


def test_a_model_loaded_as_the_server_loads_it_gives_the_one_thread_transcripts(tiny_en_bundle, sequential):
    """The server's load (``server.scheduling.Schedule``): each decode on one thread, the encoder (one call at a
    time) on two, and the decoder on two while one request runs: alone or side by side, the transcripts are the
    one-thread model's."""
    from whisperane.server.scheduling import Schedule

    schedule = Schedule(threads=1, encoder_threads=2)
    served = schedule.load_model(tiny_en_bundle)

    def request(f):
        with schedule.request():
            return whisperane.transcribe(f, model=served).to_dict()

    files = four_files()[:2]
    alone = [request(f) for f in files]
    with ThreadPoolExecutor(2) as pool:
        side_by_side = list(pool.map(request, files))
    assert alone == sequential[:2] and side_by_side == sequential[:2]


def test_transcribe_by_name_loads_the_model_once(tiny_en_bundle, monkeypatch):
    first = whisperane.transcribe(str(DATA_DIR / "LJ001-0002.flac"), model=tiny_en_bundle)
    transcription = sys.modules["whisperane.transcribe"]  # the module: ``whisperane.transcribe`` is the function
    loads, load_model = [], transcription.load_model

    def recording(*args, **kwargs):
        loads.append(args)
        return load_model(*args, **kwargs)

    monkeypatch.setattr(transcription, "load_model", recording)
    second = whisperane.transcribe(str(DATA_DIR / "LJ001-0002.flac"), model=tiny_en_bundle)
    assert loads == []  # the first call's model, reused
    assert first.to_dict() == second.to_dict()
