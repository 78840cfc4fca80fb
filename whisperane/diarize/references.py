"""Known speakers: a reference clip per name (OpenAI's ``known_speaker_names[]`` / ``known_speaker_references[]``,
``--speaker NAME=clip.wav``), its voice embedded as the windows are, and each name given to the speaker cluster
whose centroid matches it: the pairs of cluster and reference taken best first, each name and each cluster once,
a pair only when its cosine similarity reaches NAME_SIMILARITY and beats every other cluster for that reference and
every other reference for that cluster by NAME_MARGIN. A reference that matches nobody is unused; a cluster that
matches no reference keeps its SPEAKER_nn. A reference is embedded both as a full-band file's windows are and as a
file's holding telephone-band speech (``windows.mixed_embeddings``), and matched as the file's windows were."""

from __future__ import annotations

import base64
import binascii
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..audio import SAMPLE_RATE, load_audio
from ..errors import AudioError
from .clustering import normalized
from .encoder import SpeakerEncoder
from .features import to_mels
from .windows import WINDOW_HOP, WINDOW_SAMPLES, mixed_embeddings, partial_power, telephone_band_embeddings

# A clip of the same voice as a cluster lies a little higher than one of another, in general, but noise and a
# telephone band bring the two together: a name needs both a similarity and a lead over every rival (measured on
# bench_diarize.py's development set).
NAME_SIMILARITY = 0.65
NAME_MARGIN = 0.10
MIN_VOICE = WINDOW_SAMPLES  # a reference holds at least one whole window of voice (1.6 s)
MAX_VOICE = 30 * SAMPLE_RATE  # the voice embedded of a longer reference (OpenAI asks for 2-10 s)
DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w.+-]+=[\w.+-]+)*;base64,(?P<data>.*)", re.DOTALL)


@dataclass(frozen=True)
class KnownVoice:
    """A reference clip's unit-length embeddings: as a full-band file's windows (``full_band``) and as a file's
    holding telephone-band speech (``band_mixed``)."""

    full_band: np.ndarray
    band_mixed: np.ndarray

    def as_windows(self, band_mixed: bool) -> np.ndarray:
        return self.band_mixed if band_mixed else self.full_band


def reference_embeddings(known: Mapping[str, str | os.PathLike | np.ndarray],
                         encoder: SpeakerEncoder) -> dict[str, KnownVoice]:
    """Each name's reference embeddings; AudioError naming the first clip that is unreadable or holds less than
    MIN_VOICE of voice."""
    return {name: reference_embedding(name, clip, encoder) for name, clip in known.items()}


def reference_embedding(name: str, clip: str | os.PathLike | np.ndarray, encoder: SpeakerEncoder) -> KnownVoice:
    """The mean embeddings of whole windows (WINDOW_HOP apart) over the clip's voice (Silero VAD, pauses
    removed)."""
    from ..vad.regions import VOICED
    from ..vad.silero import get_speech_timestamps

    where = f"{os.fspath(clip)}: " if isinstance(clip, (str, os.PathLike)) else ""
    try:
        audio = load_audio(clip)
    except AudioError as err:
        raise AudioError(f"known speaker {name!r}: {err}") from None
    voice = np.concatenate([audio[r.start : r.end] for r in get_speech_timestamps(audio, VOICED)] or [audio[:0]])
    if len(voice) < MIN_VOICE:
        raise AudioError(f"known speaker {name!r}: {where}{len(voice) / SAMPLE_RATE:.1f} s of voice, a reference "
                         f"needs at least {MIN_VOICE / SAMPLE_RATE:.1f} s")
    voice = voice[:MAX_VOICE]
    count = 1 + (len(voice) - WINDOW_SAMPLES) // WINDOW_HOP
    starts = np.linspace(0, len(voice) - WINDOW_SAMPLES, count).round().astype(int)
    powers = np.stack([partial_power(voice[s : s + WINDOW_SAMPLES]) for s in starts])
    full_band = encoder.embed(to_mels(powers, encoder.mel_filters))
    telephone_band = telephone_band_embeddings(powers, encoder)
    return KnownVoice(normalized(full_band.astype(np.float64).mean(axis=0)),
                      normalized(mixed_embeddings(full_band, telephone_band).astype(np.float64).mean(axis=0)))


def speaker_names(centroids: np.ndarray, references: Mapping[str, KnownVoice], band_mixed: bool = False) -> dict[int, str]:
    """{cluster index: name} for the clusters (unit ``centroids`` [k, dim]) that match a reference, the references
    taken as the windows were embedded (``band_mixed``: ``SpeechWindows.band_mixed``)."""
    if not references or not len(centroids):
        return {}
    names = list(references)
    similarity = centroids @ np.stack([references[n].as_windows(band_mixed) for n in names]).T  # [clusters, references]
    out: dict[int, str] = {}
    for flat in np.argsort(-similarity, axis=None, kind="stable"):
        cluster, ref = divmod(int(flat), len(names))
        best = similarity[cluster, ref]
        if best < NAME_SIMILARITY:
            break
        if cluster in out or names[ref] in out.values():
            continue
        rivals = [*np.delete(similarity[:, ref], cluster), *np.delete(similarity[cluster], ref)]
        if not rivals or best - max(rivals) >= NAME_MARGIN:
            out[cluster] = names[ref]
    return out


def audio_from_data_url(url: str, what: str) -> np.ndarray:
    """The 16 kHz samples of a ``data:audio/...;base64,...`` URL (any format ``whisperane.audio`` reads), written to
    a temporary file to be decoded; AudioError naming ``what`` for anything else."""
    match = DATA_URL.fullmatch(url.strip())
    if match is None:
        raise AudioError(f"{what}: expected a data URL (data:audio/...;base64,...)")
    try:
        data = base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError):
        raise AudioError(f"{what}: the data URL's base64 is malformed") from None
    suffix = {"audio/wav": ".wav", "audio/x-wav": ".wav", "audio/wave": ".wav", "audio/mpeg": ".mp3",
              "audio/mp3": ".mp3", "audio/flac": ".flac", "audio/ogg": ".ogg", "audio/webm": ".webm",
              "audio/mp4": ".m4a", "audio/m4a": ".m4a"}.get((match["mime"] or "").lower(), "")
    fd, path = tempfile.mkstemp(prefix="whisperane-reference-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return load_audio(path)
    except AudioError as err:
        raise AudioError(f"{what}: {str(err).replace(path + ': ', '').replace(path, 'the clip')}") from None
    finally:
        os.unlink(path)
