"""Output writers: exact file contents, subtitle cue rules, deterministic JSON, atomic writes; the result's
``from_dict``."""

from __future__ import annotations

import copy
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from whisperane import writers
from whisperane.errors import OutputError
from whisperane.result import Segment, TranscriptionResult
from whisperane.writers import (
    atomic_write_text,
    format_timestamp,
    get_writer,
    output_paths,
    outputs_complete,
)


def result_dict() -> dict:
    """Two segments; the second crosses the one-hour mark. Word timings differ from segment bounds."""
    return {
        "text": " Hello world. Second line here.",
        "language": "en",
        "duration": 3602.0,
        "segments": [
            {
                "id": 0,
                "seek": 0,
                "start": 0.0,
                "end": 1.6,
                "text": " Hello world.",
                "tokens": [50364, 2425, 1002, 13],
                "temperature": 0.0,
                "avg_logprob": -0.25,
                "compression_ratio": 0.8,
                "no_speech_prob": 0.01,
                "words": [
                    {"word": " Hello", "start": 0.2, "end": 0.6, "probability": 0.9},
                    {"word": " world.", "start": 0.7, "end": 1.5, "probability": 0.8},
                ],
            },
            {
                "id": 1,
                "seek": 359950,
                "start": 3599.5,
                "end": 3601.25,
                "text": " Second line here.",
                "tokens": [50364, 5736, 1622, 510, 13],
                "temperature": 0.2,
                "avg_logprob": -0.5,
                "compression_ratio": 0.9,
                "no_speech_prob": 0.02,
                "words": [
                    {"word": " Second", "start": 3599.5, "end": 3600.0, "probability": 0.7},
                    {"word": " line", "start": 3600.0, "end": 3600.4, "probability": 0.6},
                    {"word": " here.", "start": 3600.6, "end": 3601.25, "probability": 0.5},
                ],
            },
        ],
    }


def make_result(data: dict | None = None) -> TranscriptionResult:
    return TranscriptionResult.from_dict(result_dict() if data is None else data)


def without_words(data: dict) -> dict:
    data = copy.deepcopy(data)
    for segment in data["segments"]:
        del segment["words"]
    return data


def write(tmp_path: Path, fmt: str, result: TranscriptionResult, **options) -> str:
    path = get_writer(fmt, tmp_path)(result, "/recordings/talk.show.m4a", options)
    assert path == tmp_path / f"talk.show.{fmt}"
    return path.read_text(encoding="utf-8")


# --- timestamps -------------------------------------------------------------------------------------


def test_format_timestamp():
    assert format_timestamp(1.5, always_include_hours=True, decimal_marker=",") == "00:00:01,500"
    assert format_timestamp(1.5) == "00:01.500"
    assert format_timestamp(3600.0) == "01:00:00.000"
    assert format_timestamp(61.0004) == "01:01.000"
    assert format_timestamp(59.9996) == "01:00.000"  # rounding carries into minutes
    with pytest.raises(ValueError):
        format_timestamp(-0.5)


# --- segment-level formats --------------------------------------------------------------------------


def test_txt(tmp_path):
    assert write(tmp_path, "txt", make_result()) == "Hello world.\nSecond line here.\n"


def test_tsv_integer_milliseconds_and_tabs(tmp_path):
    data = result_dict()
    data["segments"][1]["text"] = " Second\tline here."
    assert write(tmp_path, "tsv", make_result(data)) == (
        "start\tend\ttext\n0\t1600\tHello world.\n3599500\t3601250\tSecond line here.\n"
    )


def test_srt_segments(tmp_path):
    data = without_words(result_dict())
    data["segments"][0]["text"] = " Hello --> world."
    assert write(tmp_path, "srt", make_result(data)) == (
        "1\n00:00:00,000 --> 00:00:01,600\nHello -> world.\n\n"
        "2\n00:59:59,500 --> 01:00:01,250\nSecond line here.\n\n"
    )


def test_vtt_segments(tmp_path):
    assert write(tmp_path, "vtt", make_result(without_words(result_dict()))) == (
        "WEBVTT\n\n00:00.000 --> 00:01.600\nHello world.\n\n59:59.500 --> 01:00:01.250\nSecond line here.\n\n"
    )


# --- word-level cues --------------------------------------------------------------------------------


def test_word_cues_follow_word_timings(tmp_path):
    assert write(tmp_path, "srt", make_result()) == (
        "1\n00:00:00,200 --> 00:00:01,500\nHello world.\n\n"
        "2\n00:59:59,500 --> 01:00:01,250\nSecond line here.\n\n"
    )


def test_max_words_per_line(tmp_path):
    assert write(tmp_path, "srt", make_result(), max_words_per_line=2) == (
        "1\n00:00:00,200 --> 00:00:01,500\nHello world.\n\n"
        "2\n00:59:59,500 --> 01:00:00,400\nSecond line\n\n"
        "3\n01:00:00,600 --> 01:00:01,250\nhere.\n\n"
    )
    one = write(tmp_path, "vtt", make_result(), max_words_per_line=1)
    assert one == (
        "WEBVTT\n\n"
        "00:00.200 --> 00:00.600\nHello\n\n"
        "00:00.700 --> 00:01.500\nworld.\n\n"
        "59:59.500 --> 01:00:00.000\nSecond\n\n"
        "01:00:00.000 --> 01:00:00.400\nline\n\n"
        "01:00:00.600 --> 01:00:01.250\nhere.\n\n"
    )


def test_highlight_words(tmp_path):
    result = make_result()
    result = replace(result, segments=result.segments[:1])
    assert write(tmp_path, "vtt", result, highlight_words=True) == (
        "WEBVTT\n\n"
        "00:00.200 --> 00:00.600\n<u>Hello</u> world.\n\n"
        "00:00.600 --> 00:00.700\nHello world.\n\n"  # the gap between the words shows the plain line
        "00:00.700 --> 00:01.500\nHello <u>world.</u>\n\n"
    )


def test_max_line_width_and_count(tmp_path):
    # Width and count together ignore segment boundaries; a pause of more than 3 s starts a new cue.
    assert write(tmp_path, "srt", make_result(), max_line_width=12, max_line_count=1) == (
        "1\n00:00:00,200 --> 00:00:01,500\nHello world.\n\n"
        "2\n00:59:59,500 --> 01:00:00,400\nSecond line\n\n"
        "3\n01:00:00,600 --> 01:00:01,250\nhere.\n\n"
    )
    assert write(tmp_path, "srt", make_result(), max_line_width=12, max_line_count=2) == (
        "1\n00:00:00,200 --> 00:00:01,500\nHello world.\n\n"
        "2\n00:59:59,500 --> 01:00:01,250\nSecond line\nhere.\n\n"
    )


def test_options_dict_and_keywords_agree(tmp_path):
    writer = get_writer("vtt", tmp_path)
    by_dict = writer.render(make_result(), {"max_words_per_line": 1, "highlight_words": None})
    by_kwargs = writer.render(make_result(), None, max_words_per_line=1)
    assert by_dict == by_kwargs


# --- json -------------------------------------------------------------------------------------------


def test_json_is_deterministic_and_utf8(tmp_path):
    data = result_dict()
    data["segments"][0]["text"] = " こんにちは、世界。"
    result = make_result(data)
    first = get_writer("json", tmp_path / "a")(result, "talk.wav")  # creates the directory
    # the same values as numpy types (as arrays hold them) give the same bytes
    second_segment = replace(result.segments[1], tokens=tuple(np.array(result.segments[1].tokens, dtype=np.int64)),
                             temperature=np.float32(0.2))
    numpy_valued = replace(result, segments=(result.segments[0], second_segment))
    second = get_writer("json", tmp_path / "b")(numpy_valued, "talk.wav")
    assert first.read_bytes() == second.read_bytes()
    raw = first.read_bytes()
    assert "こんにちは".encode() in raw  # not \u-escaped
    loaded = json.loads(raw)
    assert list(loaded) == ["text", "language", "duration", "segments"]
    assert list(loaded["segments"][0])[:4] == ["id", "seek", "start", "end"]
    assert list(loaded["segments"][0]["words"][0]) == ["word", "start", "end", "probability"]
    assert loaded["segments"][1]["temperature"] == 0.2  # float32 0.2 written as 0.2, not 0.200000003


def test_json_round_trips_and_writes_nan_as_null(tmp_path):
    data = result_dict()
    data["segments"][0]["avg_logprob"] = float("nan")
    loaded = json.loads(write(tmp_path, "json", make_result(data)))
    assert loaded["segments"][0]["avg_logprob"] is None
    loaded["segments"][0]["avg_logprob"] = float("nan")
    assert json.dumps(loaded, sort_keys=True) == json.dumps(data, sort_keys=True)


@pytest.mark.parametrize("words", [True, False], ids=["words", "no-words"])
def test_from_dict_is_the_inverse_of_to_dict(tmp_path, words):
    data = {**(result_dict() if words else without_words(result_dict())), "language_probs": {"en": 0.9, "de": 0.05}}
    result = TranscriptionResult.from_dict(data)
    assert result.to_dict() == data and TranscriptionResult.from_dict(result.to_dict()) == result
    assert isinstance(result.segments[0], Segment) and result.segments[0].tokens == (50364, 2425, 1002, 13)
    assert (result.segments[1].words is None) == (not words)
    # what the JSON writer wrote reads back as the same result (a batch row's extra keys are ignored)
    written = json.loads(write(tmp_path, "json", result))
    assert TranscriptionResult.from_dict({**written, "sha256": "0" * 64, "error": None}) == result


# --- files ------------------------------------------------------------------------------------------


def test_all_formats_and_outputs_complete(tmp_path):
    audio = "/data/in/talk.mp3"
    assert not outputs_complete(audio, tmp_path, "all")
    paths = get_writer("all", tmp_path)(make_result(), audio)
    assert sorted(p.name for p in paths) == [f"talk.{ext}" for ext in ("json", "srt", "tsv", "txt", "vtt")]
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in paths)  # no temporary files left
    assert outputs_complete(audio, tmp_path, "all")
    assert outputs_complete(audio, tmp_path, ["srt", "json"])
    (tmp_path / "talk.vtt").unlink()
    assert not outputs_complete(audio, tmp_path, "all")
    assert outputs_complete(audio, tmp_path, "json")
    assert output_paths(audio, tmp_path, ["txt", "all"])[0] == tmp_path / "talk.txt"
    with pytest.raises(ValueError, match="unknown output format"):
        get_writer("docx", tmp_path)


def test_failed_render_leaves_no_file(tmp_path, monkeypatch):
    def broken_dumps(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(writers.json, "dumps", broken_dumps)
    with pytest.raises(RuntimeError):
        get_writer("json", tmp_path)(make_result(), "talk.wav")
    assert os.listdir(tmp_path) == []
    assert not outputs_complete("talk.wav", tmp_path, "json")


def test_failed_write_keeps_previous_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "talk.txt"
    atomic_write_text(target, "old transcript\n")

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writers.os, "replace", broken_replace)
    with pytest.raises(OutputError, match="talk.txt.*No space left"):
        get_writer("txt", tmp_path)(make_result(), "talk.wav")
    assert os.listdir(tmp_path) == ["talk.txt"]
    assert target.read_text() == "old transcript\n"


def test_interrupt_during_write_leaves_no_file(tmp_path, monkeypatch):
    def interrupted_fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(writers.os, "fsync", interrupted_fsync)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(tmp_path / "talk.srt", "1\n")
    assert os.listdir(tmp_path) == []


def test_atomic_write_text(tmp_path):
    old_umask = os.umask(0o022)
    try:
        path = atomic_write_text(tmp_path / "sub" / "out.txt", "héllo\n")
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == "héllo\n".encode()
    assert path.stat().st_mode & 0o777 == 0o644  # what a plain open() would give, not mkstemp's 0600
    atomic_write_text(path, "second\n")
    assert path.read_text() == "second\n"
    assert os.listdir(path.parent) == ["out.txt"]
