"""``stream=true``: a transcription as OpenAI's Server-Sent Events.

``data: {"type": "transcript.text.delta", "delta": ...}`` as each segment is kept (the first after the first
window), then one ``{"type": "transcript.text.done", "text": ...}``. A delta is the text decoded from all the
tokens so far minus the text already sent, and the done text is the decoding of all the tokens, so the deltas
concatenate exactly to it (leading spaces included) even where a character's bytes span two segments: a
trailing incomplete character (U+FFFD) is held back until its bytes are complete. An error after the stream
began is one ``data: {"error": ...}`` event (the official client raises it). A request that also asked for
``response_format=verbose_json`` gets that body's other fields (segments, words, language, duration) in its done
event, so that a client (the page) has the text as it comes and the times at the end from one decode.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..result import TranscriptionResult
from .openai_api import ApiError
from .workers import Slot

REPLACEMENT = "\ufffd"


def event(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class DeltaText:
    """The text of the tokens kept so far and what of it was already sent."""

    def __init__(self, decode: Callable[[list[int]], str], eot: int):
        self.decode, self.eot = decode, eot
        self.tokens: list[int] = []
        self.sent = ""

    def add(self, tokens: tuple[int, ...]) -> str:
        """The new delta after a segment's tokens ('' when nothing complete is new)."""
        self.tokens.extend(t for t in tokens if t < self.eot)
        text = self.decode(self.tokens).rstrip(REPLACEMENT)
        if not text.startswith(self.sent):  # cannot happen with byte-level BPE; the final delta settles it
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def rest(self, final_text: str) -> str:
        return final_text[len(self.sent) :] if final_text.startswith(self.sent) else ""


class TranscriptStream:
    """One streamed request. Its job starts when the stream is made (not when the response's body is first
    iterated, which a client gone early never does), and releases its slot when it ends. ``run(job, on_audio,
    on_segment)`` decodes the upload on a worker, calls ``on_audio()`` once its audio is accepted, and returns the
    TranscriptionResult; ``error`` turns its exception into the ApiError its client is told."""

    def __init__(self, slot: Slot, run: Callable[..., TranscriptionResult], text: DeltaText,
                 error: Callable[[BaseException], ApiError],
                 done_fields: Callable[[TranscriptionResult], dict] | None = None):
        self.slot, self.text, self.error, self.done_fields = slot, text, error, done_fields
        self.loop = asyncio.get_running_loop()
        self.segments: asyncio.Queue = asyncio.Queue()
        self.accepted = self.loop.create_future()
        self.task = asyncio.ensure_future(slot.run(run, self.on_audio, self.on_segment))
        self.task.add_done_callback(lambda _: slot.release())

    def on_audio(self) -> None:  # on the worker thread
        self.loop.call_soon_threadsafe(self.accepted.set_result, None)

    def on_segment(self, segment: Any) -> None:  # on the worker thread
        self.loop.call_soon_threadsafe(self.segments.put_nowait, segment.tokens)

    async def audio_accepted(self) -> None:
        """Returns once the upload's audio is accepted (the stream may begin); raises the ApiError of a job that
        failed before that (not audio, too long, stopped). Cancelled itself, it stops the job."""
        try:
            await asyncio.wait({self.accepted, self.task}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.slot.job.stop()
            raise
        if not self.accepted.done():  # the job ended first, and a result needs its audio accepted: it failed
            try:
                self.task.result()
            except Exception as e:  # noqa: BLE001 - every failure is answered in OpenAI's shape
                raise self.error(e) from None

    async def _next_tokens(self) -> tuple[int, ...] | None:
        """The next kept segment's tokens, or None once the job has ended and every segment was taken."""
        while self.segments.empty():
            if self.task.done():
                return None
            waiter = asyncio.ensure_future(self.segments.get())
            await asyncio.wait({waiter, self.task}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                return waiter.result()
            waiter.cancel()
        return self.segments.get_nowait()

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE body. Leaving early (Starlette cancels the body when the client disconnects) cancels the job
        at its next window."""
        try:
            while (tokens := await self._next_tokens()) is not None:
                if delta := self.text.add(tokens):
                    yield event({"type": "transcript.text.delta", "delta": delta})
            try:
                result = self.task.result()
            except Exception as e:  # noqa: BLE001 - the stream's headers are sent: the error is an event
                yield event(self.error(e).body())
                return
            if rest := self.text.rest(result.text):
                yield event({"type": "transcript.text.delta", "delta": rest})
            extra = self.done_fields(result) if self.done_fields else {}
            yield event({**extra, "type": "transcript.text.done", "text": self.text.sent + rest})
        finally:
            if not self.task.done():
                self.slot.job.cancel.set()
