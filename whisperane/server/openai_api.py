"""OpenAI's audio API on whisperane: the multipart upload, the form's options, the response formats, the errors.

The request body is parsed as it arrives (python-multipart) and the file part written straight to a temporary
file, counting bytes, so an upload over the limit is refused (413) as soon as it passes the limit, never read
whole. The official client parses a response by the ``response_format`` it asked for, not by its content type:
``text``, ``srt`` and ``vtt`` are plain text, the others JSON.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from ..audio import SAMPLE_RATE, open_audio
from ..errors import OptionsError, WhisperaneError
from ..options import TranscribeOptions
from ..result import Segment, SpeakerWord, TranscriptionResult, Word
from ..tokenizer import LANGUAGES
from ..writers import WriteSRT, WriteVTT
from .config import MAX_BATCH_SIZE, MAX_BEAM_SIZE
from .models import FIRST_MODEL_ID

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
GRANULARITIES = ("word", "segment")
MAX_FIELD_BYTES = 64 * 1024
MAX_FIELDS = 64
MAX_BOUNDARY = 70  # RFC 2046's limit on a multipart boundary's length
# whisperane's own options a request may add to OpenAI's (extra form fields), with their types.
EXTRA_OPTIONS = {"beam_size": int, "vad_filter": bool, "batch_size": int, "word_timestamps": bool, "diarize": bool,
                 "num_speakers": int, "min_speakers": int, "max_speakers": int, "multilingual": bool,
                 "carry_initial_prompt": bool, "hotwords": str}
UPPER_BOUNDS = {"beam_size": MAX_BEAM_SIZE, "batch_size": MAX_BATCH_SIZE}  # the rest is TranscribeOptions' check
READ_BLOCK = 30 * SAMPLE_RATE  # samples an upload's decode reads between two checks of its job
OPENAI_FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", "timestamp_granularities[]",
                 "stream", "known_speaker_names[]", "known_speaker_references[]")
# OpenAI's known speakers: at most 4, each a data URL of 2-10 s of audio (10 s of 48 kHz stereo WAV is 2.6 MB in base64)
MAX_KNOWN_SPEAKERS = 4
MAX_REFERENCE_BYTES = 3 * 2**20


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        if self.status == 401:
            return "authentication_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


@dataclass
class Upload:
    """A parsed request: its text fields (each name with all its values, in order) and the spooled file."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    path: str | None = None  # the temporary file the upload was written to (removed by ``remove``)
    filename: str = "file"
    size: int = 0
    removed: bool = False

    def value(self, name: str) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else None

    def remove(self) -> None:
        """Unlink the spooled file (once); ``path`` is kept, so that later messages can still hide it."""
        if self.path is not None and not self.removed:
            self.removed = True
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def public_message(self, message: str) -> str:
        """``message`` with the spool file's path replaced by the uploaded file's name (no server paths)."""
        if self.path:
            message = message.replace(self.path, self.filename)
        return message.replace(tempfile.gettempdir(), "<tmp>")


class _Parser:
    """python-multipart's callbacks: text fields into memory (bounded), the file part into a temporary file."""

    def __init__(self, upload: Upload, max_bytes: int, spool_dir: str | None):
        self.upload, self.max_bytes, self.spool_dir = upload, max_bytes, spool_dir
        self.header_name, self.header_value = b"", b""
        self.disposition = b""
        self.name: str | None = None
        self.data = bytearray()
        self.file = None

    def on_part_begin(self) -> None:
        self.disposition, self.name, self.data, self.file = b"", None, bytearray(), None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        if self.header_name.lower() == b"content-disposition":
            self.disposition = self.header_value
        self.header_name, self.header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, params = parse_options_header(self.disposition)
        if b"name" not in params:
            raise ApiError(400, "a multipart part has no name")
        self.name = params[b"name"].decode("utf-8", "replace")
        if b"filename" in params and self.name == "file":
            if self.upload.path is not None:
                raise ApiError(400, "more than one file was sent", param="file")
            self.upload.filename = os.path.basename(params[b"filename"].decode("utf-8", "replace")) or "file"
            suffix = os.path.splitext(self.upload.filename)[1].lower()
            fd, self.upload.path = tempfile.mkstemp(prefix="whisperane-upload-", dir=self.spool_dir,
                                                    suffix=suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", suffix) else "")
            self.file = os.fdopen(fd, "wb")
        elif sum(len(v) for v in self.upload.fields.values()) >= MAX_FIELDS:
            raise ApiError(400, "too many form fields")
        elif self.name.startswith("known_speaker_") and len(self.upload.fields.get(self.name, ())) >= MAX_KNOWN_SPEAKERS:
            raise ApiError(400, f"at most {MAX_KNOWN_SPEAKERS} known speakers", param=self.name)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.file is not None:
            self.file.write(data[start:end])
            self.upload.size += end - start
        else:
            self.data += data[start:end]
            if len(self.data) > (MAX_REFERENCE_BYTES if self.name == "known_speaker_references[]" else MAX_FIELD_BYTES):
                raise ApiError(400, f"the form field '{self.name}' is too long", param=self.name)

    def on_part_end(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        elif self.name is not None:
            self.upload.fields.setdefault(self.name, []).append(self.data.decode("utf-8", "replace"))

    def callbacks(self) -> dict:
        return {name: getattr(self, name) for name in ("on_part_begin", "on_header_field", "on_header_value",
                "on_header_end", "on_headers_finished", "on_part_data", "on_part_end")}


def audio_too_long(limit_s: float) -> ApiError:
    return ApiError(400, f"the audio is longer than this server's limit of {limit_s / 60:g} minutes", param="file",
                    code="audio_too_long")


def decode_upload(upload: Upload, limit_s: float, check: Callable[[], None],
                  budget: Callable[[float], float] | None = None) -> np.ndarray:
    """The upload's samples, 16 kHz mono float32: the one time the server opens the spooled file, so that a
    file is parsed and decoded once, and ``transcribe()`` (given the samples) reads its windows twice from
    memory, as from a path. 400 for a file that is not audio or holds values no audio has, and for one longer
    than ``limit_s``: from its header where it states the length (nothing decoded), else once the decode passes
    the limit. ``check()`` runs between blocks (a job's cancel flag and time budget); reading may take at most
    ``budget(seconds read so far)`` (a file that decodes slower than that is not read on)."""
    limit = int(limit_s * SAMPLE_RATE)
    blocks, n, started = [], 0, time.monotonic()
    try:
        with open_audio(upload.path) as stream:
            if (stated := stream.stated_samples) is not None and stated > limit:
                raise audio_too_long(limit_s)
            while n <= limit and len(block := stream.read(n, min(READ_BLOCK, limit + 1 - n))):
                blocks.append(block)
                n += len(block)
                check()
                if budget is not None and time.monotonic() - started > budget(n / SAMPLE_RATE):
                    raise ApiError(400, f"reading the audio took longer than this server allows for "
                                   f"{n / SAMPLE_RATE:.1f} s of it ({budget(n / SAMPLE_RATE):.0f} s)",
                                   param="file", code="decode_time_exceeded")
    except WhisperaneError as e:
        raise ApiError(400, upload.public_message(str(e)), param="file", code="invalid_file") from None
    if n > limit:
        raise audio_too_long(limit_s)
    return _joined(blocks, n)


def _joined(blocks: list[np.ndarray], n: int) -> np.ndarray:
    """The blocks as one array, each freed once copied: the audio is held about once, not twice, at the join."""
    samples = np.empty(n, np.float32)
    start = 0
    while blocks:
        block = blocks.pop(0)
        samples[start : start + len(block)] = block
        start += len(block)
    return samples


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"the upload is larger than the server's limit of {max_bytes / 2**20:g} MB",
                    param="file", code="file_too_large")


async def read_upload(content_type: str | None, body: AsyncIterator[bytes], max_bytes: int,
                      spool_dir: str | None = None) -> Upload:
    """Parse a multipart body as it arrives; the file part goes to a temporary file (removed on any error)."""
    kind, params = parse_options_header(content_type)
    if kind != b"multipart/form-data" or b"boundary" not in params:
        raise ApiError(400, "expected a multipart/form-data body with the audio as the 'file' field", param="file")
    if not 0 < len(params[b"boundary"]) <= MAX_BOUNDARY:
        raise ApiError(400, f"the multipart boundary must be 1 to {MAX_BOUNDARY} characters long", param="file")
    upload = Upload()
    parser_state = _Parser(upload, max_bytes, spool_dir)
    parser = MultipartParser(params[b"boundary"], parser_state.callbacks())
    received = 0
    try:
        async for chunk in body:
            received += len(chunk)
            if received > max_bytes + MAX_FIELDS * MAX_FIELD_BYTES // 16 + MAX_KNOWN_SPEAKERS * MAX_REFERENCE_BYTES:
                raise too_large(max_bytes)
            parser.write(chunk)
            if upload.size > max_bytes:
                raise too_large(max_bytes)
        parser.finalize()
    except (ApiError, ClientDisconnect):
        upload.remove()
        raise
    except Exception:  # a malformed body (python-multipart's errors)
        upload.remove()
        raise ApiError(400, "the multipart body is malformed") from None
    except BaseException:
        upload.remove()
        raise
    finally:
        if parser_state.file is not None:
            parser_state.file.close()
    return upload


@dataclass(frozen=True)
class RequestOptions:
    """What one request asked for: the model's id, the output, and the transcription's options."""

    model: str
    response_format: str = "json"
    stream: bool = False
    granularities: tuple[str, ...] = ("segment",)
    transcribe: TranscribeOptions = field(default_factory=TranscribeOptions)


def form_flag(name: str, value: str) -> bool:
    """A true/false form field or query parameter; 400 for any other value."""
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ApiError(400, f"{name} must be true or false, not {value!r}", param=name)


def _number(name: str, value: str, kind: type) -> float | int:
    try:
        return kind(value)
    except ValueError:
        raise ApiError(400, f"{name} must be a number, not {value!r}", param=name) from None


def served_model_id(requested: str | None, model_ids: Sequence[str]) -> str:
    """The id of a model this server serves (loaded, or loaded on its first request) that a request names (none:
    ``whisper-1``, the first); 404 for any other."""
    model = requested or FIRST_MODEL_ID
    if model != FIRST_MODEL_ID and model not in model_ids:
        raise ApiError(404, f"the model '{model}' is not served here; served: {', '.join(model_ids)} "
                       f"({FIRST_MODEL_ID}: the first)", param="model", code="model_not_found")
    return model


def request_options(upload: Upload, task: str, model_ids: Sequence[str]) -> RequestOptions:
    """The request's options from its form fields; 400 for an unknown field or value, 404 for an unknown model."""
    allowed = set(OPENAI_FIELDS) | set(EXTRA_OPTIONS)
    if task == "translate":
        allowed -= {"language", "timestamp_granularities[]", "stream"}
    for name in upload.fields:
        if name not in allowed:
            raise ApiError(400, f"unknown option '{name}'", param=name, code="unknown_parameter")
    if upload.path is None:
        raise ApiError(400, "no audio file: send it as the multipart field 'file'", param="file")
    model = served_model_id(upload.value("model"), model_ids)
    response_format = upload.value("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(400, f"unknown response_format '{response_format}'; one of {', '.join(RESPONSE_FORMATS)}",
                       param="response_format")
    granularities = tuple(upload.fields.get("timestamp_granularities[]", ["segment"]))
    for g in granularities:
        if g not in GRANULARITIES:
            raise ApiError(400, f"unknown timestamp granularity '{g}'", param="timestamp_granularities[]")
    kwargs: dict = {"task": task}
    if upload.value("language"):
        kwargs["language"] = upload.value("language")
    if upload.value("prompt"):
        kwargs["initial_prompt"] = upload.value("prompt")
    if upload.value("temperature"):
        t = float(_number("temperature", upload.value("temperature"), float))
        if not 0.0 <= t <= 1.0:
            raise ApiError(400, "temperature must be between 0 and 1", param="temperature")
        if t > 0:  # 0: OpenAI's "raise the temperature while the thresholds fail", whisperane's fallback
            kwargs["temperature"] = (t,)
    for name, kind in EXTRA_OPTIONS.items():
        if (value := upload.value(name)) is not None:
            kwargs[name] = form_flag(name, value) if kind is bool else value if kind is str else _number(name, value, kind)
            if name in UPPER_BOUNDS and kwargs[name] > UPPER_BOUNDS[name]:
                raise ApiError(400, f"{name} may be at most {UPPER_BOUNDS[name]} on this server", param=name,
                               code="invalid_option")
    if "word" in granularities and kwargs.get("word_timestamps") is False:
        raise ApiError(400, "word timestamps were asked for with word_timestamps=false", param="word_timestamps")
    if "known_speaker_names[]" in upload.fields or "known_speaker_references[]" in upload.fields:
        kwargs["known_speakers"] = known_speakers(upload)
    stream = form_flag("stream", upload.value("stream") or "false")
    if response_format == "diarized_json":  # OpenAI's speaker segments: diarize implied
        kwargs["diarize"] = kwargs.get("diarize", True)
    if stream and kwargs.get("diarize"):
        raise ApiError(400, "diarize labels the finished transcript: it cannot be streamed", param="stream")
    try:
        transcribe = TranscribeOptions(**kwargs)
    except (OptionsError, TypeError) as e:
        raise options_error(e) from None
    return RequestOptions(model, response_format, stream, granularities, transcribe)


def known_speakers(upload: Upload) -> dict[str, np.ndarray]:
    """OpenAI's ``known_speaker_names[]`` and ``known_speaker_references[]`` (data URLs), pair by pair, decoded."""
    from ..diarize.references import audio_from_data_url  # base64 and a temporary file: only when sent

    names = upload.fields.get("known_speaker_names[]", [])
    references = upload.fields.get("known_speaker_references[]", [])
    if len(names) != len(references):
        raise ApiError(400, f"{len(names)} known_speaker_names[] for {len(references)} known_speaker_references[]: "
                       "give one reference per name", param="known_speaker_references[]")
    try:
        return {name: audio_from_data_url(url, f"the reference of known speaker {name!r}")
                for name, url in zip(names, references, strict=True)}
    except WhisperaneError as e:
        raise ApiError(400, str(e), param="known_speaker_references[]", code="invalid_file") from None


def options_error(e: OptionsError | TypeError) -> ApiError:
    return ApiError(400, str(e), code="invalid_option")


def render(result: TranscriptionResult, options: RequestOptions, task: str) -> tuple[str | dict, str]:
    """The response body and its media type for the asked format."""
    fmt = options.response_format
    if fmt == "json":
        return {"text": result.text}, "application/json"
    if fmt == "text":
        return result.text, "text/plain; charset=utf-8"
    if fmt in ("srt", "vtt"):
        writer = WriteSRT(".") if fmt == "srt" else WriteVTT(".")
        return writer.render(result), "text/plain; charset=utf-8"
    if fmt == "diarized_json":
        return diarized_json(result, task), "application/json"
    return verbose_json(result, options, task), "application/json"


def diarized_json(result: TranscriptionResult, task: str) -> dict:
    """OpenAI's ``diarized_json`` (gpt-4o-transcribe-diarize): one segment per speaker's stretch of text."""
    segments = [{"type": "transcript.text.segment", "id": f"seg_{s.id}", "speaker": s.speaker, "start": s.start,
                 "end": s.end, "text": s.text} for s in result.segments]
    return {"task": task, "duration": result.duration, "text": result.text, "segments": segments,
            "usage": {"type": "duration", "seconds": round(result.duration, 3)}}


def verbose_json(result: TranscriptionResult, options: RequestOptions, task: str) -> dict:
    body = {"task": task, "language": LANGUAGES.get(result.language, result.language), "duration": result.duration,
            "text": result.text}
    if "segment" in options.granularities:
        body["segments"] = [_segment(s) for s in result.segments]
    if "word" in options.granularities:
        body["words"] = [_word(w) for s in result.segments for w in s.words or ()]
    if result.speaker_turns is not None:
        body["speakers"] = result.speaker_summary
    return body


def _word(w: Word) -> dict:
    word = {"word": w.word, "start": w.start, "end": w.end}
    return {**word, "speaker": w.speaker} if isinstance(w, SpeakerWord) else word


def _segment(s: Segment) -> dict:
    """OpenAI's segment object: whisperane's segment without its words (those are the response's ``words``)."""
    return {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens),
            "temperature": s.temperature, "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
            "no_speech_prob": s.no_speech_prob, **({} if s.speaker is None else {"speaker": s.speaker}),
            **({} if s.language is None else {"language": s.language})}
