"""Live audio over a WebSocket, on the live-transcription engine (``LiveTranscriber``), one stream per connection.

Protocol (``/v1/audio/live?model=ID&language=xx``): the client sends binary frames of raw 16 kHz mono s16le PCM
(any length) and, to finish, a text frame ``{"type": "end"}`` (or simply closes); the server sends each of the
engine's events as a JSON text frame (``StreamEvent.to_dict()``: ``hypothesis``, ``confirmed``, then one
``done`` with the final result) and closes. Frames keep arriving on one task while ``feed()`` runs on a worker,
and everything that arrived meanwhile goes to the next ``feed()``, so a slow update never makes the stream fall
further behind than one update. Errors are one ``{"type": "error", "error": {...}}`` frame, then a close.
With an API key, a browser (which cannot set headers on a WebSocket) sends it as the subprotocol
``bearer.KEY`` beside ``whisperane``.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import WhisperaneError
from ..live import LiveTranscriber
from .openai_api import ApiError
from .workers import Slot

SUBPROTOCOL = "whisperane"
BEARER_PREFIX = "bearer."
LIVE_OPTIONS = ("model", "language")
WS_POLICY_VIOLATION, WS_TRY_AGAIN_LATER = 1008, 1013


class Frames:
    """The PCM received and not yet fed (an odd trailing byte waits for its pair), and whether the client ended."""

    def __init__(self):
        self.pending = bytearray()
        self.ended = False
        self.gone = False  # the client disconnected instead of ending: nothing is finished or sent
        self.arrived = asyncio.Event()

    def add(self, data: bytes) -> None:
        self.pending += data
        self.arrived.set()

    def end(self) -> None:
        self.ended = True
        self.arrived.set()

    def take(self) -> np.ndarray:
        """All whole samples received so far, as float32 in [-1, 1)."""
        n = len(self.pending) // 2 * 2
        samples = np.frombuffer(bytes(self.pending[:n]), dtype="<i2").astype(np.float32) / 32768.0
        del self.pending[:n]
        self.arrived.clear()
        return samples


async def _receive(websocket: WebSocket, frames: Frames) -> None:
    try:
        while not frames.ended:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                frames.gone = True
                break
            if message.get("bytes") is not None:
                frames.add(message["bytes"])
            elif message.get("text") is not None:
                if json.loads(message["text"] or "{}").get("type") == "end":
                    break
    except (WebSocketDisconnect, RuntimeError):
        frames.gone = True
    except ValueError:  # a text frame that is not JSON: taken as the end
        pass
    frames.end()


def _key_from(websocket: WebSocket) -> str | None:
    header = websocket.headers.get("authorization")
    if header:
        return header
    for protocol in websocket.scope.get("subprotocols", []):
        if protocol.startswith(BEARER_PREFIX):
            return "Bearer " + protocol[len(BEARER_PREFIX) :]
    return None


def _stream_options(websocket: WebSocket, server) -> tuple[object, dict]:
    params = websocket.query_params
    for name in params:
        if name not in LIVE_OPTIONS:
            raise ApiError(400, f"unknown option '{name}'", param=name, code="unknown_parameter")
    model_id = params.get("model") or "whisper-1"
    if model_id != "whisper-1" and model_id not in server.models:
        raise ApiError(404, f"the model '{model_id}' is not loaded", param="model", code="model_not_found")
    options = {"language": params["language"]} if params.get("language") else {}
    return server.model(model_id), options


async def _send_events(websocket: WebSocket, events) -> None:
    for e in events:
        await websocket.send_text(json.dumps(e.to_dict(), ensure_ascii=False))


async def live_session(websocket: WebSocket, server) -> None:
    subprotocol = SUBPROTOCOL if SUBPROTOCOL in websocket.scope.get("subprotocols", []) else None
    if not server.authorized(_key_from(websocket)):
        await websocket.close(code=WS_POLICY_VIOLATION, reason="a valid API key is needed")
        return
    await websocket.accept(subprotocol=subprotocol)
    try:
        model, options = _stream_options(websocket, server)
        slot = server.reserve()
    except ApiError as e:
        await websocket.send_text(json.dumps({"type": "error", **e.body()}))
        await websocket.close(code=WS_TRY_AGAIN_LATER if e.status == 503 else WS_POLICY_VIOLATION)
        return
    with slot:
        await _run_stream(websocket, slot, model, options)


async def _run_stream(websocket: WebSocket, slot: Slot, model, options: dict) -> None:
    frames = Frames()
    receiver = asyncio.ensure_future(_receive(websocket, frames))
    try:
        transcriber = LiveTranscriber(model, **options)
        while True:
            await frames.arrived.wait()
            if frames.gone:
                return
            samples = frames.take()
            if len(samples):
                await _send_events(websocket, await slot.run(lambda job, s: transcriber.feed(s), samples))
            if frames.ended and not frames.pending:
                break
        await _send_events(websocket, await slot.run(lambda job: transcriber.finish()))
        await websocket.close()
    except (WhisperaneError, TypeError) as e:  # a bad option (OptionsError), a stream the engine refused
        await websocket.send_text(json.dumps({"type": "error", **ApiError(400, str(e)).body()}))
        await websocket.close(code=WS_POLICY_VIOLATION)
    except (WebSocketDisconnect, RuntimeError):  # the client went away: nothing more to send
        pass
    finally:
        receiver.cancel()
