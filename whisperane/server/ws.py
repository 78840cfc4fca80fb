"""Live audio over a WebSocket, on the live-transcription engine (``LiveTranscriber``), one stream per connection.

Protocol (``/v1/audio/live?model=ID&language=xx``): the client sends binary frames of raw 16 kHz mono s16le PCM
(any length) and, to finish, the text frame ``{"type": "end"}``; the server sends each of the engine's events
as a JSON text frame (``StreamEvent.to_dict()``: ``hypothesis``, ``confirmed``, then one ``done`` with the final
result) and closes with 1000. Frames keep arriving on one task while ``feed()`` runs on a worker, and everything
that arrived meanwhile goes to the next ``feed()``, so a slow update never makes the stream fall further behind
than one update. With an API key, a browser (which cannot set headers on a WebSocket) sends it as the
subprotocol ``bearer.KEY`` beside ``whisperane`` (checked with the Host and Origin in access.py).

Every frame either advances the session or ends it: an error is one ``{"type": "error", "error": {...}}`` frame,
then a close with one of the codes below and a reason. A session whose client sends nothing for the idle timeout,
or does not read what it is sent, is ended and its slot freed; so is one that raises anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import WhisperaneError
from ..audio import SAMPLE_RATE
from ..audio_decode import pcm_to_float
from ..live import LiveTranscriber
from .deadlines import shutting_down, within
from .openai_api import ApiError, form_flag, served_model_id
from .workers import Cancelled, Slot

SUBPROTOCOL = "whisperane"
# query parameters: the model, and the engine's options (``prompt``, OpenAI's name: the initial prompt)
LIVE_OPTIONS = ("model", "language", "prompt", "carry_initial_prompt", "hotwords")
BYTES_PER_SECOND = 2 * SAMPLE_RATE  # s16le mono
# Close codes (RFC 6455): what each means to a client is in docs/GUIDE.md.
WS_DONE, WS_GOING_AWAY, WS_UNSUPPORTED_DATA = 1000, 1001, 1003
WS_POLICY_VIOLATION, WS_INTERNAL_ERROR, WS_TRY_AGAIN_LATER = 1008, 1011, 1013
MAX_REASON = 120  # a close frame's reason fits in 123 bytes
CLOSE_TIMEOUT_S = 2.0
log = logging.getLogger("whisperane.server")


class SessionEnd(Exception):
    """Ends a session: the error frame its client is sent (None: none) and the close code."""

    def __init__(self, code: int, error: ApiError | None):
        super().__init__(error.message if error else "")
        self.code, self.error = code, error


class Frames:
    """The PCM received and not yet fed (an odd trailing byte waits for its pair), and whether the client ended."""

    def __init__(self):
        self.pending = bytearray()
        self.received = 0
        self.ended = False
        self.gone = False  # the client disconnected instead of ending: nothing is finished or sent
        self.arrived = asyncio.Event()

    def add(self, data: bytes) -> None:
        if not self.ended:
            self.pending += data
            self.received += len(data)
            self.arrived.set()

    def end(self) -> None:
        self.ended = True
        self.arrived.set()

    def whole_samples(self) -> bool:
        return len(self.pending) >= 2

    def take(self) -> np.ndarray:
        """All whole samples received so far, as float32 in [-1, 1) (a half sample left at the end is dropped)."""
        n = len(self.pending) // 2 * 2
        samples = pcm_to_float(np.frombuffer(bytes(self.pending[:n]), dtype="<i2"))
        del self.pending[:n]
        self.arrived.clear()
        return samples


def _stream_options(websocket: WebSocket, server) -> tuple[str, dict]:
    params = websocket.query_params
    for name in params:
        if name not in LIVE_OPTIONS:
            raise ApiError(400, f"unknown option '{name}'", param=name, code="unknown_parameter")
    model_id = served_model_id(params.get("model"), list(server.models))
    options = {name: params[key] for key, name in (("language", "language"), ("prompt", "initial_prompt"),
                                                    ("hotwords", "hotwords")) if params.get(key)}
    if "carry_initial_prompt" in params:
        options["carry_initial_prompt"] = form_flag("carry_initial_prompt", params["carry_initial_prompt"])
    return model_id, options


def _end_message(text: str) -> None:
    """The one text frame the protocol has, ``{"type": "end"}``; anything else ends the session (1003)."""
    try:
        message = json.loads(text)
    except ValueError:
        message = None
    if not (isinstance(message, dict) and message.get("type") == "end"):
        raise SessionEnd(WS_UNSUPPORTED_DATA, ApiError(400, 'a text frame must be {"type": "end"}; audio goes in '
                                                       "binary frames", code="unsupported_frame"))


def _reason(error: ApiError | None) -> str:
    return (error.message if error else "").encode()[:MAX_REASON].decode("utf-8", "ignore")


class LiveSession:
    """One connection's stream: its frames, its engine, its slot in the decode pool."""

    def __init__(self, websocket: WebSocket, server, slot: Slot, transcriber: LiveTranscriber):
        self.websocket, self.server, self.slot, self.transcriber = websocket, server, slot, transcriber
        self.config = server.config
        self.frames = Frames()
        self.stopping = False  # the server is stopping: finish with what has arrived, close with 1001

    @classmethod
    async def serve(cls, websocket: WebSocket, server) -> None:
        subprotocol = SUBPROTOCOL if SUBPROTOCOL in websocket.scope.get("subprotocols", []) else None
        await websocket.accept(subprotocol=subprotocol)
        lease = None
        try:
            model_id, options = _stream_options(websocket, server)
            lease = await server.models.lease(model_id)  # held for the stream's life: never unloaded under it
            transcriber = LiveTranscriber(lease.model, **options)
            slot = server.reserve()
        except (ApiError, WhisperaneError, TypeError) as e:  # a bad option (OptionsError), busy, stopping
            if lease is not None:
                lease.release()
            error = e if isinstance(e, ApiError) else ApiError(400, str(e), code="invalid_option")
            code = WS_TRY_AGAIN_LATER if error.status == 503 else WS_POLICY_VIOLATION
            return await cls._close(websocket, code, error)
        session = cls(websocket, server, slot, transcriber)
        server.live.add(session)
        try:
            with slot:
                await session.run()
        finally:
            server.live.discard(session)
            lease.release()

    def finish_now(self) -> None:
        """The server is stopping: no more audio is taken; what arrived is finished and sent."""
        self.stopping = True
        self.frames.end()

    async def run(self) -> None:
        receiver = asyncio.ensure_future(self._receive())
        try:
            await self._stream(receiver)
        except SessionEnd as e:
            await self._close(self.websocket, e.code, e.error)
        except Cancelled as e:  # the pool stopped the job: the server is stopping (or the client has gone)
            if e.reason is not None:
                await self._close(self.websocket, WS_GOING_AWAY, shutting_down())
        except WebSocketDisconnect:
            pass
        except Exception as e:  # noqa: BLE001 - any failure ends the session and frees its slot
            log.exception("live session failed", exc_info=e)
            await self._close(self.websocket, WS_INTERNAL_ERROR, ApiError(500, "internal server error"))
        finally:
            receiver.cancel()

    async def _stream(self, receiver: asyncio.Future) -> None:
        while True:
            await self._arrival(receiver)
            if self.frames.gone:
                return
            samples = self.frames.take()
            if len(samples):
                await self._send(await self.slot.run(lambda job, s: self.transcriber.feed(s), samples))
            if self.frames.ended and not self.frames.whole_samples():
                break
        await self._send(await self.slot.run(lambda job: self.transcriber.finish()))
        await self._close(self.websocket, WS_GOING_AWAY if self.stopping else WS_DONE, None)

    async def _arrival(self, receiver: asyncio.Future) -> None:
        """Until frames arrive or the receiver ends; the receiver's error ends the session."""
        waiter = asyncio.ensure_future(self.frames.arrived.wait())
        try:
            await asyncio.wait({waiter, receiver}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if receiver.done() and receiver.exception() is not None:
            raise receiver.exception()

    async def _receive(self) -> None:
        idle, limit = self.config.idle_timeout_s, self.config.max_audio_seconds
        while not self.frames.ended:
            try:
                message = await within(self.websocket.receive(), idle, self.server.stopping)
            except TimeoutError:
                raise SessionEnd(WS_POLICY_VIOLATION, ApiError(408, f"no message for {idle:g} s", code="idle_timeout")) from None
            except ApiError as e:  # the server is stopping
                raise SessionEnd(WS_GOING_AWAY, e) from None
            if message["type"] == "websocket.disconnect":
                self.frames.gone = True
                break
            if message.get("bytes") is not None:
                self.frames.add(message["bytes"])
                if self.frames.received > limit * BYTES_PER_SECOND:
                    raise SessionEnd(WS_POLICY_VIOLATION, ApiError(400, f"the stream is longer than this server's "
                                     f"{limit / 60:g} minutes", code="audio_too_long"))
            else:
                _end_message(message.get("text") or "")
                break
        self.frames.end()

    async def _send(self, events) -> None:
        for e in events:
            try:
                await within(self.websocket.send_text(json.dumps(e.to_dict(), ensure_ascii=False)),
                             self.config.idle_timeout_s, self.server.stopping)
            except TimeoutError:
                raise SessionEnd(WS_POLICY_VIOLATION, None) from None  # a client that does not read
            except ApiError as e:
                raise SessionEnd(WS_GOING_AWAY, e) from None

    @staticmethod
    async def _close(websocket: WebSocket, code: int, error: ApiError | None) -> None:
        """The error frame (if any), then the close; a client already gone, or not reading, is no error."""

        async def close() -> None:
            if error is not None:
                await websocket.send_text(json.dumps({"type": "error", **error.body()}))
            await websocket.close(code=code, reason=_reason(error))

        try:
            await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)
        except (WebSocketDisconnect, RuntimeError, OSError, TimeoutError):
            pass
