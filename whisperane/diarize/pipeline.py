"""Diarization of one audio, start to end: speech windows and their embeddings (``windows``), speakers by
clustering (``clustering``), turns (``turns``); ``with_speakers`` (``words``) puts them on a transcript."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from ..audio import AudioStream, open_audio
from ..errors import OptionsError
from ..result import SpeakerTurn
from ..vad.silero import SileroVad
from .clustering import SpeakerCount, cluster_windows
from .encoder import SpeakerEncoder, default_encoder
from .turns import speaker_turns
from .windows import embed_speech


def stream_opener(audio: str | os.PathLike | np.ndarray | AudioStream) -> Callable[[], AudioStream]:
    """A function opening the audio afresh each call (diarization reads it twice: the VAD, then its speech)."""
    if isinstance(audio, AudioStream):
        if not audio.in_memory:
            raise OptionsError("diarize reads the audio twice (VAD, then speech): pass a path or an array")
        return lambda: AudioStream.from_array(audio.read_all(), name=audio.name)
    return lambda: open_audio(audio)


def diarize(audio: str | os.PathLike | np.ndarray | AudioStream, count: SpeakerCount | None = None,
            encoder: SpeakerEncoder | None = None, vad: SileroVad | None = None) -> tuple[SpeakerTurn, ...]:
    """Who spoke when: speaker turns in time order, labelled SPEAKER_00, ... in order of first speech."""
    windows = embed_speech(stream_opener(audio), encoder or default_encoder(), vad)
    return speaker_turns(windows, cluster_windows(windows.embeddings, count or SpeakerCount(), windows.reliable))
