"""``whisperane transcribe``: every output format, stdout JSON, exit codes, batches, skip/overwrite, determinism.

Most runs call ``cli.main`` in this process with one tiny.en model loaded for the module (``load_model`` is
patched to hand it out); a few run the real command in a subprocess to check what a user sees on stderr.
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile as sf

import whisperane.loading
import whisperane.util
from whisperane import command as cli

REPO = Path(__file__).resolve().parents[1]
JFK = REPO / "tests" / "data" / "jfk.flac"
JFK_TEXT = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
# Short clips in tests/data that tiny.en transcribes word for word (transcripts: tests/data/README.md).
SHORT = (REPO / "tests" / "data" / "LJ001-0002.flac", "in being comparatively modern.")  # 22.05 kHz
SHORTER = (REPO / "tests" / "data" / "1089-134691-0000.flac", "HE COULD WAIT NO LONGER")


def words(text: str) -> list[str]:
    """Lower-case words without punctuation (enough normalisation for these clips)."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    import jiwer

    return jiwer.wer(" ".join(words(reference)), " ".join(words(hypothesis)) or "<empty>")


def error_lines(stderr: str | list[str]) -> list[str]:
    lines = stderr.splitlines() if isinstance(stderr, str) else stderr
    return [line for line in lines if line.startswith("whisperane: error:")]


def whisperane_cmd(*argv, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "whisperane", *map(str, argv)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )


# --- output formats ---------------------------------------------------------------------------------------


def parse_cues(text: str, decimal: str) -> list[tuple[float, float, str]]:
    stamp = rf"(?:(\d+):)?(\d\d):(\d\d){re.escape(decimal)}(\d\d\d)"
    cues = []
    for m in re.finditer(rf"^{stamp} --> {stamp}\n(.+?)\n\n", text, re.M | re.S):
        h1, m1, s1, ms1, h2, m2, s2, ms2, body = m.groups()
        start = int(h1 or 0) * 3600 + int(m1) * 60 + int(s1) + int(ms1) / 1000
        end = int(h2 or 0) * 3600 + int(m2) * 60 + int(s2) + int(ms2) / 1000
        cues.append((start, end, body))
    return cues


def test_all_output_formats_for_jfk(run, tmp_path):
    code, out, err = run(JFK, "-o", tmp_path, "-f", "all")
    assert code == 0 and out == "" and not error_lines(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jfk.json", "jfk.srt", "jfk.tsv", "jfk.txt", "jfk.vtt"]

    data = json.loads((tmp_path / "jfk.json").read_text(encoding="utf-8"))
    assert data["language"] == "en" and data["duration"] == pytest.approx(11.0, abs=0.01)
    assert word_error_rate(JFK_TEXT, data["text"]) == 0.0
    segments = data["segments"]
    assert [s["id"] for s in segments] == list(range(len(segments)))
    all_words = [w for s in segments for w in s["words"]]
    assert [w["word"] for w in all_words] and words("".join(w["word"] for w in all_words)) == words(JFK_TEXT)
    for s in segments:
        assert 0 <= s["start"] <= s["end"] <= data["duration"]
        assert "".join(w["word"] for w in s["words"]) == s["text"]
        for w in s["words"]:
            assert set(w) == {"word", "start", "end", "probability"}
            assert s["start"] - 0.02 <= w["start"] <= w["end"] <= s["end"] + 0.02
            assert 0.0 <= w["probability"] <= 1.0
    starts = [w["start"] for w in all_words]
    assert starts == sorted(starts)

    txt = (tmp_path / "jfk.txt").read_text(encoding="utf-8")
    assert txt.splitlines() == [s["text"].strip() for s in segments]

    tsv = (tmp_path / "jfk.tsv").read_text(encoding="utf-8").splitlines()
    assert tsv[0] == "start\tend\ttext"
    rows = [line.split("\t") for line in tsv[1:]]
    assert [(int(a), int(b), t) for a, b, t in rows] == [
        (round(1000 * s["start"]), round(1000 * s["end"]), s["text"].strip()) for s in segments
    ]

    # Subtitles: one cue per segment, timed by its first and last word.
    for ext, decimal in (("srt", ","), ("vtt", ".")):
        text = (tmp_path / f"jfk.{ext}").read_text(encoding="utf-8")
        if ext == "vtt":
            assert text.startswith("WEBVTT\n\n")
        else:
            assert re.findall(r"^(\d+)\n\d\d:", text, re.M) == [str(i + 1) for i in range(len(segments))]
        cues = parse_cues(text, decimal)
        assert len(cues) == len(segments)
        for (start, end, body), s in zip(cues, segments, strict=True):
            assert start == pytest.approx(s["words"][0]["start"], abs=1e-3)
            assert end == pytest.approx(s["words"][-1]["end"], abs=1e-3)
            assert words(body) == words(s["text"])


def test_stdout_json_matches_the_file_byte_for_byte(run, tmp_path):
    code, out, err = run(JFK, "--output-dir", "-")
    assert code == 0 and not error_lines(err)
    assert out.endswith("\n") and out.count("\n") == 1
    data = json.loads(out)
    assert word_error_rate(JFK_TEXT, data["text"]) == 0.0
    # A second run of the same input, model and options gives the same bytes (here: written to a file).
    code, _, _ = run(JFK, "-o", tmp_path)
    assert code == 0
    assert (tmp_path / "jfk.json").read_bytes() == out.encode("utf-8")


# --- batches, exit codes ----------------------------------------------------------------------------------


def test_batch_finishes_good_files_reports_bad_ones_and_skips_on_rerun(tmp_path, tiny_en_bundle, run):
    """The real command: a.wav, bad.mp3, good.flac -> both good ones written, the bad one reported at the end."""
    samples, sr = sf.read(SHORT[0], dtype="float32")
    sf.write(tmp_path / "a.wav", samples, sr, subtype="PCM_16")
    (tmp_path / "bad.mp3").write_bytes(b"ID3 this is not an mp3 file at all " * 40)
    shutil.copy(SHORTER[0], tmp_path / "good.flac")
    out = tmp_path / "out"
    argv = ["transcribe", "a.wav", "bad.mp3", "good.flac", "-o", out, "--model", tiny_en_bundle]

    first = whisperane_cmd(*argv, cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    assert "Traceback" not in first.stderr
    errors = error_lines(first.stderr)
    assert len(errors) == 1 and "bad.mp3" in errors[0] and "not a valid MP3 file" in errors[0]
    lines = first.stderr.splitlines()
    summary = lines.index("whisperane: 1 of 3 file(s) failed:")
    assert summary > max(i for i, line in enumerate(lines) if "good.flac ->" in line)
    assert lines[summary + 1 :] == ["  " + errors[0].removeprefix("whisperane: error: ")]
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "good.json"]
    assert word_error_rate(SHORT[1], json.loads((out / "a.json").read_text())["text"]) == 0.0
    assert word_error_rate(SHORTER[1], json.loads((out / "good.json").read_text())["text"]) == 0.0

    # Re-run: complete outputs are skipped (untouched), the bad file fails again.
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = whisperane_cmd(*argv, cwd=tmp_path)
    assert again.returncode == 1
    assert "a.wav: outputs complete, skipped (use --overwrite)" in again.stderr
    assert "good.flac: outputs complete, skipped (use --overwrite)" in again.stderr
    assert len(error_lines(again.stderr)) == 1
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps

    # --overwrite transcribes again, here in another process: byte-identical JSON.
    before = (out / "a.json").read_bytes()
    code, _, err = run(tmp_path / "a.wav", "-o", out, "--overwrite")
    assert code == 0 and not error_lines(err)
    assert (out / "a.json").stat().st_mtime_ns != stamps["a.json"]
    assert (out / "a.json").read_bytes() == before


def test_directory_batch_mirrors_subdirectories(run, tmp_path):
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    shutil.copy(SHORTER[0], src / "clip.flac")
    shutil.copy(SHORTER[0], src / "sub" / "clip.flac")  # same name: must not overwrite the other's output
    (src / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 10)
    (src / "notes.txt").write_text("not audio, ignored")
    out = tmp_path / "out"
    code, _, err = run(src, "-o", out)
    assert code == 1
    errors = error_lines(err)
    assert len(errors) == 1 and "broken.wav" in errors[0]
    assert err[-2:] == ["whisperane: 1 of 3 file(s) failed:", "  " + errors[0].removeprefix("whisperane: error: ")]
    for result in (out / "clip.json", out / "sub" / "clip.json"):
        assert word_error_rate(SHORTER[1], json.loads(result.read_text())["text"]) == 0.0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["clip.json", "sub/clip.json"]


def test_same_output_name_in_one_batch_is_refused_not_overwritten(run, tmp_path):
    shutil.copy(SHORTER[0], tmp_path / "x.flac")
    samples, sr = sf.read(SHORT[0], dtype="float32")
    sf.write(tmp_path / "x.wav", samples, sr)
    code, _, err = run(tmp_path / "x.flac", tmp_path / "x.wav", "-o", tmp_path / "out")
    assert code == 1
    (error,) = error_lines(err)
    assert "x.wav" in error and "would overwrite" in error
    assert word_error_rate(SHORTER[1], json.loads((tmp_path / "out" / "x.json").read_text())["text"]) == 0.0


@pytest.mark.parametrize(
    "argv",
    [[], ["a.wav", "-f", "docx"], ["a.wav", "--task", "summarize"], ["a.wav", "--temperature", "warm"]],
    ids=["no-audio", "bad-format", "bad-task", "bad-number"],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["transcribe", *argv])
    assert exit_info.value.code == 2
    assert "usage: whisperane transcribe" in capsys.readouterr().err


def test_negative_threads_exit_2(run, tmp_path):
    code, _, err = run(JFK, "-o", tmp_path, "--threads", "-1")
    assert code == 2 and err == ["whisperane: error: --threads must be >= 0"]


def test_unknown_model_name_is_one_line(tmp_path):
    result = whisperane_cmd("transcribe", JFK, "--model", "no-such-model", "-o", tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == error_lines(result.stderr)
    (line,) = result.stderr.splitlines()
    assert "no-such-model" in line and "unknown model" in line
    assert list(tmp_path.iterdir()) == []


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("whisperane ")


# --- output errors ----------------------------------------------------------------------------------------


def test_output_dir_that_is_a_file(run, tmp_path):
    target = tmp_path / "taken"
    target.write_text("a file, not a directory")
    code, _, err = run(JFK, "-o", target)
    assert code == 1
    assert len(err) == 1 and err[0].startswith(f"whisperane: error: {target}: cannot create the output directory")
    assert target.read_text() == "a file, not a directory"


@pytest.mark.parametrize(
    "where, error, cause",
    [("fsync", errno.ENOSPC, "No space left on device"), ("open", errno.EACCES, "Permission denied")],
    ids=["disk-full", "permission-denied"],
)
def test_write_failure_is_one_line_and_leaves_nothing(run, tmp_path, monkeypatch, where, error, cause):
    real = getattr(os, where)

    def failing(*args, **kwargs):
        if where == "open" and not str(args[0]).endswith(".tmp"):
            return real(*args, **kwargs)
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(whisperane.util.os, where, failing)  # the one atomic write (a full disk fails its fsync)
    out = tmp_path / "out"
    code, _, err = run(SHORTER[0], "-o", out)
    monkeypatch.undo()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("whisperane: error: ")
    assert str(out / "1089-134691-0000.json") in err[0] and cause in err[0]
    assert list(out.iterdir()) == []  # neither the final file nor a temporary one


def test_unexpected_exception_is_one_line_and_the_batch_goes_on(run, tmp_path, monkeypatch):
    module = importlib.import_module("whisperane.transcribe")  # `whisperane.transcribe` is the function
    real = module.transcribe_with

    def flaky(model, audio, *args, **kwargs):
        if str(audio).endswith("first.flac"):
            raise RuntimeError("simulated failure\nwith a second line")
        return real(model, audio, *args, **kwargs)

    monkeypatch.setattr(module, "transcribe_with", flaky)
    shutil.copy(SHORTER[0], tmp_path / "first.flac")
    shutil.copy(SHORTER[0], tmp_path / "second.flac")
    code, _, err = run(tmp_path / "first.flac", tmp_path / "second.flac", "-o", tmp_path / "out")
    assert code == 1
    (error,) = error_lines(err)
    assert "first.flac: internal error (RuntimeError: simulated failure with a second line)" in error
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["second.json"]


def test_progress_bar_only_for_long_audio_on_a_terminal(monkeypatch):
    class Terminal:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

        def write(self, text):
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Terminal(True))
    bar = cli.progress_bar(None, 600.0, "long.wav")
    assert bar is not None
    bar.update(30.0, 600.0)
    assert bar.tqdm.n == pytest.approx(30.0)
    bar.close()
    assert cli.progress_bar(None, 20.0, "short.wav") is None
    assert cli.progress_bar(False, 600.0, "long.wav") is None
    monkeypatch.setattr(sys, "stderr", Terminal(False))
    assert cli.progress_bar(None, 600.0, "long.wav") is None
    assert cli.progress_bar(True, 5.0, "short.wav") is not None
