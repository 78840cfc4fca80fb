"""Diarization of one transcribed audio: the speech (``speech``: Silero VAD's and the transcript's words), windows
over it and their embeddings (``windows``), speakers by clustering (``clustering``), named where they match a known
speaker (``references``), turns inside the speech (``turns``); ``with_speakers`` (``words``) puts them on the
transcript. Before there is a transcript, ``speaker_changes`` finds where the voice changes from the VAD's speech
alone (``multilingual`` cuts its speech regions there)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from itertools import pairwise

import numpy as np

from ..audio import SAMPLE_RATE, AudioStream, open_audio
from ..errors import OptionsError
from ..result import SpeakerTurn, TranscriptionResult
from ..vad.regions import SpeechRegion
from .clustering import SpeakerCount, centroids_of, cluster_windows
from .encoder import SpeakerEncoder, default_encoder
from .references import KnownVoice, reference_embeddings, speaker_names
from .speech import embedding_regions, speech_probabilities, speech_spans, vad_speech
from .turns import speaker_turns
from .windows import SpeechWindows, embed_speech, transcript_speech


def stream_opener(audio: str | os.PathLike | np.ndarray | AudioStream) -> Callable[[], AudioStream]:
    """A function opening the audio afresh (diarization reads it after the transcription has)."""
    if isinstance(audio, AudioStream):
        if not audio.in_memory:
            raise OptionsError("diarize reads the audio twice (the transcription, then its speech): pass a path or "
                               "an array")
        return lambda: AudioStream.from_array(audio.read_all(), name=audio.name)
    return lambda: open_audio(audio)


def diarize(open_stream: Callable[[], AudioStream], transcript: TranscriptionResult | None,
            count: SpeakerCount | None = None, encoder: SpeakerEncoder | None = None,
            references: Mapping[str, KnownVoice] | None = None) -> tuple[SpeakerTurn, ...]:
    """Who spoke when in the transcribed audio ``open_stream()`` opens (``transcript`` None: before any transcript,
    over the VAD's speech alone): speaker turns in time order, labelled with the name of the known speaker they match
    (``references``: ``known_speaker_embeddings``), the others SPEAKER_00, ... in order of first speech."""
    windows, speech = speech_windows(open_stream, transcript, encoder)
    clusters = cluster_windows(windows.embeddings, windows.chunks, count)
    centroids = centroids_of(windows.embeddings.astype(np.float64), clusters)
    names = speaker_names(centroids, references, windows.band_mixed) if references and len(clusters) else {}
    return speaker_turns(windows, clusters, names, speech)


def speaker_changes(open_stream: Callable[[], AudioStream], count: SpeakerCount | None = None,
                    encoder: SpeakerEncoder | None = None) -> tuple[int, ...]:
    """Where the speaker changes (samples, in order), from the voices alone before any transcript: between two
    consecutive turns of different speakers, the middle of the pause between them (their meeting point where there
    is none). Known speakers' names change no turn's bounds: none are needed here."""
    turns = diarize(open_stream, None, count, encoder)
    return tuple(round((before.end + after.start) / 2 * SAMPLE_RATE)
                 for before, after in pairwise(turns) if before.speaker != after.speaker)


def speech_windows(open_stream: Callable[[], AudioStream], transcript: TranscriptionResult | None,
                   encoder: SpeakerEncoder | None = None) -> tuple[SpeechWindows, tuple[SpeechRegion, ...]]:
    """The windows embedded over the audio's speech (the VAD's and the transcript's words; the VAD's alone without a
    transcript), and the speech turns may cover (``speech.speech_spans``): the audio read for the VAD, then for the
    windows (``windows.embed_speech``: twice where part of it is telephone-band)."""
    with open_stream() as stream:
        probabilities, n_samples = speech_probabilities(stream)
    vad = vad_speech(probabilities, n_samples)
    if transcript is None:  # no words yet: an empty transcript of the audio's length
        transcript = TranscriptionResult(text="", language="", duration=n_samples / SAMPLE_RATE, segments=())
    windows = embed_speech(open_stream, embedding_regions(transcript_speech(transcript), vad),
                           encoder or default_encoder(), transcript.duration)
    return windows, speech_spans(transcript, vad, probabilities, n_samples)


def known_speaker_embeddings(known: Mapping[str, str | os.PathLike | np.ndarray],
                             encoder: SpeakerEncoder | None = None) -> dict[str, KnownVoice]:
    """The known speakers' reference embeddings, read before the transcription: a bad clip fails at once."""
    return reference_embeddings(known, encoder or default_encoder())
