"""Output writers: json (default), txt, srt, vtt, tsv, as openai-whisper writes them; with speakers (diarize), srt
and vtt cues prefixed ``[SPEAKER_00]: `` as WhisperX writes them, txt with a speaker line at each change, and rttm.

Every writer takes the :class:`~whisperane.result.TranscriptionResult` that ``transcribe()`` returns; the JSON
writer writes its ``to_dict()``. Every file is rendered to a string first and then written atomically
(``util.atomic_write``: a temporary file in the same directory, fsync, ``os.replace``), so an interrupted run
never leaves a partial file under a final name.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from .errors import OutputError
from .result import Segment, SpeakerWord, TranscriptionResult, Word
from .util import atomic_write

OUTPUT_FORMATS = ("txt", "vtt", "srt", "tsv", "json")
SPEAKER_FORMATS = ("rttm",)  # needs diarize; not part of "all"

# Keys in the order they are written; unknown keys follow, sorted.
_RESULT_KEYS = ("text", "language", "duration", "segments", "speakers", "speaker_turns")
_SEGMENT_KEYS = (
    "id", "seek", "start", "end", "text", "tokens", "temperature",
    "avg_logprob", "compression_ratio", "no_speech_prob", "words",
)
_WORD_KEYS = ("word", "start", "end", "probability", "speaker")
_KEY_ORDER = {"": _RESULT_KEYS, "segments": _SEGMENT_KEYS, "words": _WORD_KEYS,
              "speakers": ("speaker", "duration"), "speaker_turns": ("speaker", "start", "end")}

SUBTITLE_OPTIONS = ("max_line_width", "max_line_count", "highlight_words", "max_words_per_line")


# --------------------------------------------------------------------------------------------------
# atomic files


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` (its directory created) so that the final name only ever holds a complete
    file; an OSError becomes an OutputError that names the file."""
    path = Path(path)
    data = text.encode(encoding)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{path}: cannot create the output directory: {e.strerror or e}") from e
    try:
        return atomic_write(path, lambda f: f.write(data))
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from e


# --------------------------------------------------------------------------------------------------
# timestamps


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """``[HH:]MM:SS.mmm``, rounded to the millisecond (hours only when needed unless asked)."""
    if seconds < 0:
        raise ValueError(f"non-negative timestamp expected, got {seconds}")
    milliseconds = round(seconds * 1000.0)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds, milliseconds = divmod(milliseconds, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{seconds:02d}{decimal_marker}{milliseconds:03d}"


# --------------------------------------------------------------------------------------------------
# writers


class ResultWriter:
    """Renders a result to text and writes ``<audio stem>.<extension>`` in ``output_dir``."""

    extension: str

    def __init__(self, output_dir: str | os.PathLike):
        self.output_dir = Path(output_dir)

    def output_path(self, audio_path: str | os.PathLike) -> Path:
        return self.output_dir / f"{Path(audio_path).stem}.{self.extension}"

    def __call__(
        self, result: TranscriptionResult, audio_path: str | os.PathLike, options: dict | None = None, **kwargs
    ) -> Path:
        text = self.render(result, options, **kwargs)
        return atomic_write_text(self.output_path(audio_path), text)

    def render(self, result: TranscriptionResult, options: dict | None = None, **kwargs) -> str:
        raise NotImplementedError


class WriteTXT(ResultWriter):
    extension = "txt"

    def render(self, result: TranscriptionResult, options: dict | None = None, **kwargs) -> str:
        lines, speaker = [], None
        for segment in result.segments:
            if segment.speaker is not None and segment.speaker != speaker:
                speaker = segment.speaker
                lines.append(f"[{speaker}]\n")
            lines.append(f"{segment.text.strip()}\n")
        return "".join(lines)


class WriteRTTM(ResultWriter):
    """NIST RTTM, one ``SPEAKER`` line per speaker turn (the audio's stem as the file id): what diarization
    tools exchange. Needs a result with speakers (diarize)."""

    extension = "rttm"

    def __call__(self, result: TranscriptionResult, audio_path: str | os.PathLike, options: dict | None = None,
                 **kwargs) -> Path:
        text = self.render(result, uri=Path(audio_path).stem)
        return atomic_write_text(self.output_path(audio_path), text)

    def render(self, result: TranscriptionResult, options: dict | None = None, uri: str = "audio", **kwargs) -> str:
        if result.speaker_turns is None:
            raise OutputError(f"{uri}.rttm: the transcript has no speakers: transcribe with diarize")
        uri = "_".join(uri.split()) or "audio"
        return "".join(f"SPEAKER {uri} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>\n"
                       for t in result.speaker_turns)


def _options(options: dict | None, kwargs: dict) -> dict:
    merged = {key: None for key in SUBTITLE_OPTIONS}
    for source in (options or {}, kwargs):
        for key, value in source.items():
            if key in merged and value is not None:
                merged[key] = value
    return merged


class SubtitlesWriter(ResultWriter):
    """Cues from word timings when the result has them (line width/count, words per line, highlighting),
    otherwise one cue per segment; the same rules as openai-whisper's ``--max_line_width`` etc."""

    always_include_hours: bool
    decimal_marker: str

    def format_timestamp(self, seconds: float) -> str:
        return format_timestamp(seconds, self.always_include_hours, self.decimal_marker)

    def iterate_result(
        self, result: TranscriptionResult, options: dict | None = None, **kwargs
    ) -> Iterator[tuple[str, str, str]]:
        """(start, end, text) for each cue."""
        opts = _options(options, kwargs)
        segments = result.segments
        if any(segment.words for segment in segments):
            for cue in _word_cues(segments, opts):
                prefix = f"[{cue[0].speaker}]: " if isinstance(cue[0], SpeakerWord) else ""
                for start, end, text in self._render_word_cue(cue, bool(opts["highlight_words"])):
                    yield start, end, prefix + text
        else:
            for segment in segments:
                prefix = f"[{segment.speaker}]: " if segment.speaker is not None else ""
                yield (
                    self.format_timestamp(segment.start),
                    self.format_timestamp(segment.end),
                    prefix + _cue_text(segment.text.strip()),
                )

    def _render_word_cue(self, cue: list[Word], highlight: bool) -> Iterator[tuple[str, str, str]]:
        start = self.format_timestamp(cue[0].start)
        end = self.format_timestamp(cue[-1].end)
        words = [_cue_text(word.word) for word in cue]
        text = "".join(words)
        if not highlight:
            yield start, end, text
            return
        # One cue per word with that word underlined; gaps between words show the plain line.
        last = start
        for i, word in enumerate(cue):
            word_start = self.format_timestamp(word.start)
            word_end = self.format_timestamp(word.end)
            if word_start != last:
                yield last, word_start, text
            underlined = [_underline(w) if j == i else w for j, w in enumerate(words)]
            yield word_start, word_end, "".join(underlined)
            last = word_end


def _cue_text(text: str) -> str:
    # "-->" inside a cue would be parsed as a timing line.
    return text.replace("-->", "->")


_LEADING_SPACE = re.compile(r"^(\s*)(.*)$", re.DOTALL)


def _underline(word: str) -> str:
    return _LEADING_SPACE.sub(r"\1<u>\2</u>", word)


def _word_cues(segments: Sequence[Segment], opts: dict) -> Iterator[list[Word]]:
    """Group word timings into cues; each word's text carries its own leading space or line break.

    Without both a line width and a line count every segment starts a new cue (and, with
    max_words_per_line, every run of that many words does). With both, cues are filled line by line
    up to the width and count, and a pause of more than 3 s starts a new cue.
    """
    max_line_width = opts["max_line_width"]
    max_line_count = opts["max_line_count"]
    preserve_segments = max_line_count is None or max_line_width is None
    max_line_width = max_line_width or 1000
    max_words_per_line = opts["max_words_per_line"] or 1000

    line_len = 0
    line_count = 1
    cue: list[Word] = []
    last_start = _first_start(segments)
    for segment in segments:
        words = segment.words or ()
        for chunk_start in range(0, len(words), max_words_per_line):
            for i, timing in enumerate(words[chunk_start : chunk_start + max_words_per_line]):
                long_pause = not preserve_segments and timing.start - last_start > 3.0
                has_room = line_len + len(timing.word) <= max_line_width
                # a cue holds one speaker: a change of speaker starts a new cue, whatever the layout
                speaker_break = len(cue) > 0 and getattr(timing, "speaker", None) != getattr(cue[-1], "speaker", None)
                segment_break = (i == 0 and len(cue) > 0 and preserve_segments) or speaker_break
                if line_len > 0 and has_room and not long_pause and not segment_break:
                    line_len += len(timing.word)  # continues the line
                else:
                    timing = replace(timing, word=timing.word.strip())
                    if (
                        len(cue) > 0
                        and max_line_count is not None
                        and (long_pause or line_count >= max_line_count)
                        or segment_break
                    ):
                        yield cue  # new cue
                        cue = []
                        line_count = 1
                    elif line_len > 0:
                        line_count += 1  # new line in the same cue
                        timing = replace(timing, word="\n" + timing.word)
                    line_len = len(timing.word.strip())
                cue.append(timing)
                last_start = timing.start
    if cue:
        yield cue


def _first_start(segments: Iterable[Segment]) -> float:
    for segment in segments:
        for word in segment.words or ():
            return word.start
    return 0.0


class WriteVTT(SubtitlesWriter):
    extension = "vtt"
    always_include_hours = False
    decimal_marker = "."

    def render(self, result: TranscriptionResult, options: dict | None = None, **kwargs) -> str:
        cues = [
            f"{start} --> {end}\n{text}\n\n"
            for start, end, text in self.iterate_result(result, options, **kwargs)
        ]
        return "WEBVTT\n\n" + "".join(cues)


class WriteSRT(SubtitlesWriter):
    extension = "srt"
    always_include_hours = True
    decimal_marker = ","

    def render(self, result: TranscriptionResult, options: dict | None = None, **kwargs) -> str:
        cues = self.iterate_result(result, options, **kwargs)
        return "".join(
            f"{i}\n{start} --> {end}\n{text}\n\n" for i, (start, end, text) in enumerate(cues, start=1)
        )


class WriteTSV(ResultWriter):
    """``start<TAB>end<TAB>text`` per segment, times in integer milliseconds (locale-proof, easy to parse)."""

    extension = "tsv"

    def render(self, result: TranscriptionResult, options: dict | None = None, **kwargs) -> str:
        lines = ["start\tend\ttext\n"]
        for segment in result.segments:
            text = segment.text.strip().replace("\t", " ")
            lines.append(f"{round(1000 * segment.start)}\t{round(1000 * segment.end)}\t{text}\n")
        return "".join(lines)


class WriteJSON(ResultWriter):
    """UTF-8 JSON of ``result.to_dict()`` on one line (plus a final newline): keys in a fixed order, floats
    rounded to ``FLOAT_DECIMALS`` places, numpy scalars/arrays as plain numbers/lists, NaN/Inf as null. The
    same result always gives the same bytes."""

    extension = "json"
    FLOAT_DECIMALS = 6

    def render(self, result: TranscriptionResult, options: dict | None = None, **kwargs) -> str:
        canonical = _canonical(result.to_dict(), "", self.FLOAT_DECIMALS)
        return json.dumps(canonical, ensure_ascii=False, allow_nan=False) + "\n"


def _canonical(value, parent_key: str, decimals: int):
    """A JSON-ready copy with deterministic key order and float formatting."""
    if isinstance(value, dict):
        order = _KEY_ORDER.get(parent_key, ())
        known = [k for k in order if k in value]
        rest = sorted((k for k in value if k not in order), key=str)
        return {str(k): _canonical(value[k], str(k), decimals) for k in known + rest}
    if isinstance(value, (list, tuple)):
        return [_canonical(v, parent_key, decimals) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):  # numpy scalars and arrays
        return _canonical(value.tolist(), parent_key, decimals)
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        rounded = round(value, decimals)
        return rounded + 0.0  # no "-0.0"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"cannot write a {type(value).__name__} to JSON")


_WRITERS: dict[str, type[ResultWriter]] = {
    "txt": WriteTXT,
    "vtt": WriteVTT,
    "srt": WriteSRT,
    "tsv": WriteTSV,
    "json": WriteJSON,
    "rttm": WriteRTTM,
}


def _expand_formats(formats: str | Iterable[str]) -> list[str]:
    names = [formats] if isinstance(formats, str) else list(formats)
    expanded: list[str] = []
    for name in names:
        for fmt in OUTPUT_FORMATS if name == "all" else [name]:
            if fmt not in _WRITERS:
                raise ValueError(
                    f"unknown output format {fmt!r}; choose from {', '.join(OUTPUT_FORMATS + SPEAKER_FORMATS)} or all"
                )
            if fmt not in expanded:
                expanded.append(fmt)
    return expanded


def get_writer(output_format: str, output_dir: str | os.PathLike) -> Callable[..., Path | list[Path]]:
    """A callable ``writer(result, audio_path, options=None, **subtitle_options)`` that writes the file(s)
    and returns the path (or, for "all", the list of paths)."""
    if output_format == "all":
        writers = [_WRITERS[fmt](output_dir) for fmt in OUTPUT_FORMATS]

        def write_all(result: TranscriptionResult, audio_path: str | os.PathLike, options: dict | None = None, **kwargs):
            return [writer(result, audio_path, options, **kwargs) for writer in writers]

        return write_all
    (fmt,) = _expand_formats(output_format)
    return _WRITERS[fmt](output_dir)


def output_paths(
    audio_path: str | os.PathLike, output_dir: str | os.PathLike, formats: str | Iterable[str]
) -> list[Path]:
    """The files the given formats write for ``audio_path``."""
    return [_WRITERS[fmt](output_dir).output_path(audio_path) for fmt in _expand_formats(formats)]


def outputs_complete(
    audio_path: str | os.PathLike, output_dir: str | os.PathLike, formats: str | Iterable[str]
) -> bool:
    """True when every output file for ``audio_path`` already exists (writes are atomic, so an existing
    file is a complete one): the CLI skips such inputs unless asked to overwrite."""
    return all(path.is_file() for path in output_paths(audio_path, output_dir, formats))
