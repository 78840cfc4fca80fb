"""A transcription as an iterator of its windows (``Transcription``, ``SeekLoop``), as faster-whisper's
``generate_segments``: what each window keeps comes out as it is decoded, in order, and adds up to the result; the
caller sets the pace and cancels by stopping, after which the audio is closed."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import DATA_DIR

import whisperane
from whisperane.audio import SAMPLE_RATE, load_audio, open_audio
from whisperane.options import TranscribeOptions
from whisperane.transcribe import Transcription, transcribe_with

CLIPS = ["jfk.flac", "1089-134686-0001.flac", "1089-134691-0001.flac", "LJ001-0002.flac"]


@pytest.fixture(scope="module")
def long_audio() -> np.ndarray:
    """About 70 s of speech (four clips, twice, 1.5 s apart): three windows or more."""
    pause = np.zeros(int(1.5 * SAMPLE_RATE), np.float32)
    pieces = [piece for name in CLIPS * 2 for piece in (load_audio(DATA_DIR / name), pause)]
    return np.concatenate(pieces)


def test_the_windows_add_up_to_the_result(tiny_int8_model, long_audio):
    transcription = Transcription(tiny_int8_model, long_audio, TranscribeOptions(language="en"))
    windows = list(transcription)
    assert len(windows) >= 3 and transcription.result is not None
    kept = [s for w in windows for s in w.segments]
    assert kept == list(transcription.result.segments)  # numbered and rounded as the result holds them
    assert [s.id for s in kept] == list(range(len(kept)))
    done = [w.done for w in windows]
    assert done == sorted(done) and windows[-1].done == pytest.approx(windows[-1].duration, abs=0.02)
    assert windows[-1].duration == pytest.approx(len(long_audio) / SAMPLE_RATE, abs=0.01)
    # transcribe()'s callbacks are the same iteration
    seen, progress = [], []
    result = transcribe_with(tiny_int8_model, long_audio, TranscribeOptions(language="en"), progress=lambda d, t: progress.append(d),
                             on_segment=seen.append)
    assert result.to_dict() == transcription.result.to_dict() and seen == kept and progress == done


def test_stopping_closes_the_audio(tiny_int8_model, long_audio, monkeypatch, tmp_path):
    import soundfile as sf

    path = tmp_path / "long.wav"
    sf.write(path, long_audio, SAMPLE_RATE)
    opened, closed = [], []

    def recording_open(source, **kwargs):
        stream = open_audio(source, **kwargs)
        close = stream.close
        stream.close = lambda: closed.append(stream) or close()
        opened.append(stream)
        return stream

    monkeypatch.setattr(sys.modules["whisperane.transcribe"], "open_audio", recording_open)
    windows = iter(Transcription(tiny_int8_model, str(path), TranscribeOptions(language="en")))
    first = next(windows)
    assert first.segments and first.done < first.duration
    assert any(stream not in closed for stream in opened)  # the loop's stream (a first pass read the file's peak)
    windows.close()  # the caller stops: nothing more is read, and the audio is closed now
    assert all(stream in closed for stream in opened)


def test_a_stopped_transcription_has_no_result(tiny_int8_model, long_audio):
    transcription = Transcription(tiny_int8_model, long_audio, TranscribeOptions(language="en"))
    for _ in transcription:
        break
    assert transcription.result is None


def test_bad_options_for_the_model_fail_before_any_audio_is_read(tiny_int8_model):
    with pytest.raises(whisperane.OptionsError):
        Transcription(tiny_int8_model, "no-such-file.wav", TranscribeOptions(task="translate"))
