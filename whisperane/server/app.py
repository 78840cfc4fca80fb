"""The FastAPI app: OpenAI's audio routes, /v1/models, /health, the live WebSocket and the page.

Models are loaded once, before the app is made, and shared by every request; a request's ``model`` field only
picks among them by id (``whisper-1``: the first), so no request can make the server open a path or download.
Every error a client sees is OpenAI's ``{"error": {...}}`` with a 4xx status for what the client sent wrong
(the official client retries 5xx, uploading the file again), and no message holds a server path or a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from .. import OptionsError, TranscribeOptions, WhisperaneError, WhisperaneModel, __version__
from ..audio import open_audio
from .openai_api import (
    ApiError,
    RequestOptions,
    Upload,
    options_error,
    read_upload,
    render,
    request_options,
    too_large,
)
from .sse import DeltaText, TranscriptStream
from .workers import Cancelled, DecodePool, QueueFull, Slot
from .ws import live_session

PAGE_DIR = Path(__file__).parent / "page"
# Open without the key: /health, and the page's static files (the page asks for the key and sends it itself).
OPEN_PATHS = ("/health", "/")
PAGE_PREFIX = "/page/"
log = logging.getLogger("whisperane.server")


@dataclass(frozen=True)
class ServerConfig:
    api_key: str | None = None
    max_upload_mb: float = 25.0
    max_audio_minutes: float = 60.0
    workers: int = 2  # decodes at once, one ONNX Runtime thread each
    queue: int = 16  # requests admitted beyond the workers (more are answered 503 at once)
    retry_after_s: int = 2
    spool_dir: str | None = None  # where uploads are written while they are decoded (default: the system's)


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def public_error(e: BaseException, upload: Upload | None = None) -> ApiError:
    """The ApiError a client sees for any exception of a decode."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, (OptionsError, TypeError)):
        return options_error(e)
    if isinstance(e, WhisperaneError):
        message = upload.public_message(str(e)) if upload else str(e)
        return ApiError(400, message, param="file", code="invalid_file")
    log.exception("internal error", exc_info=e)
    return ApiError(500, "internal server error", code="internal_error")


class Server:
    """The app's state: the models by id, the config and the decode pool."""

    def __init__(self, models: dict[str, WhisperaneModel], config: ServerConfig):
        if not models:
            raise ValueError("the server needs at least one model")
        self.models, self.config = models, config
        self.pool = DecodePool(config.workers, config.queue)
        self.created = int(time.time())

    def model(self, model_id: str) -> WhisperaneModel:
        return next(iter(self.models.values())) if model_id == "whisper-1" else self.models[model_id]

    def authorized(self, header: str | None) -> bool:
        key = self.config.api_key
        if not key:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())

    def reserve(self) -> Slot:
        try:
            return self.pool.reserve()
        except QueueFull:
            raise ApiError(503, "the server is busy: every worker and the queue are taken; retry later",
                           code="server_busy", headers={"Retry-After": str(self.config.retry_after_s)}) from None

    def check_audio(self, upload: Upload) -> None:
        """400 for a file that is not audio or too long (read on a thread: a header, or ffmpeg's decode)."""
        try:
            with open_audio(upload.path) as stream:
                duration = stream.duration
        except WhisperaneError as e:
            raise ApiError(400, upload.public_message(str(e)), param="file", code="invalid_file") from None
        limit = self.config.max_audio_minutes
        if duration > limit * 60:
            raise ApiError(400, f"the audio lasts {duration / 60:.1f} minutes; this server takes at most {limit:g}",
                           param="file", code="audio_too_long")

    async def transcription(self, request: Request, task: str) -> Response:
        max_bytes = int(self.config.max_upload_mb * 2**20)
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_bytes + 2**20:
            raise too_large(max_bytes)  # refused from the header: the body is never read
        slot = self.reserve()
        upload: Upload | None = None
        try:
            upload = await read_upload(request.headers.get("content-type"), request.stream(), max_bytes,
                                       self.config.spool_dir)
            options = request_options(upload, task, list(self.models))
            try:
                TranscribeOptions(**options.transcribe)  # an invalid value is a 400 before any decode or stream
            except (OptionsError, TypeError) as e:
                raise options_error(e) from None
            model = self.model(options.model)
            if task == "translate" and not model.is_multilingual:
                raise ApiError(400, f"the model '{options.model}' is English-only and cannot translate", param="model")
            await run_in_threadpool(self.check_audio, upload)
            if options.stream:
                response = self._stream(slot, upload, model, options)
                slot = upload = None  # the stream's generator owns them now
                return response
            return await self._complete(request, slot, upload, model, options, task)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it: the client has gone mid-upload
        finally:
            if upload is not None:
                upload.remove()
            if slot is not None:
                slot.release()

    async def _complete(self, request: Request, slot: Slot, upload: Upload, model: WhisperaneModel,
                        options: RequestOptions, task: str) -> Response:
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, slot))
        try:
            result = await slot.run(_decode, model, upload.path, options.transcribe, None)
        except Cancelled:
            return Response(status_code=400)  # the client has gone
        except Exception as e:  # noqa: BLE001 - every failure is answered in OpenAI's shape
            raise public_error(e, upload) from None
        finally:
            watch.cancel()
        body, media_type = render(result, options, task)
        if isinstance(body, dict):
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=media_type)

    def _stream(self, slot: Slot, upload: Upload, model: WhisperaneModel, options: RequestOptions) -> Response:
        tokenizer = model.tokenizer()
        run = lambda job, on_segment: _decode(job, model, upload.path, options.transcribe, on_segment)  # noqa: E731
        stream = TranscriptStream(slot, run, DeltaText(tokenizer.decode, tokenizer.eot),
                                  lambda e: public_error(e, upload).body())
        stream.task.add_done_callback(lambda _: upload.remove())
        return StreamingResponse(stream.events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _decode(job, model: WhisperaneModel, path: str, kwargs: dict, on_segment) -> dict:
    return model.transcribe(path, progress=job.check, on_segment=on_segment, **kwargs).to_dict()


async def _cancel_on_disconnect(request: Request, slot: Slot) -> None:
    """Waits for the client to go (the body is read by then, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    slot.job.cancel.set()


def create_app(models: dict[str, WhisperaneModel], config: ServerConfig | None = None) -> FastAPI:
    """The app over ``models`` (id -> loaded model; the first is ``whisper-1``)."""
    server = Server(models, config or ServerConfig())
    app = FastAPI(title="whisperane", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        path = request.url.path
        if not (path in OPEN_PATHS or path.startswith(PAGE_PREFIX) or server.authorized(request.headers.get("authorization"))):
            return error_response(ApiError(401, "a valid API key is needed: Authorization: Bearer KEY",
                                           code="invalid_api_key"))
        return await call_next(request)

    _add_error_handlers(app)
    _add_routes(app, server)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, FastAPI's and Starlette's own (404, 405, validation) included."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return error_response(e)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return error_response(ApiError(e.status_code, str(e.detail)))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        return error_response(ApiError(400, "the request is malformed"))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        return error_response(public_error(e))


def _add_routes(app: FastAPI, server: Server) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok", "models": list(server.models), "admitted": server.pool.admitted,
                "running": server.pool.running, "capacity": server.pool.capacity, "cancelled": server.pool.cancelled}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(i, server) for i in server.models]}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str):
        if model_id != "whisper-1" and model_id not in server.models:
            raise ApiError(404, f"the model '{model_id}' is not loaded", param="model", code="model_not_found")
        return _model_card(model_id, server)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await server.transcription(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await server.transcription(request, "translate")

    @app.websocket("/v1/audio/live")
    async def live(websocket: WebSocket):
        await live_session(websocket, server)

    @app.get("/")
    async def page():
        return FileResponse(PAGE_DIR / "index.html", media_type="text/html")

    @app.get("/page/{name}")
    async def page_file(name: str):
        if name not in {p.name for p in PAGE_DIR.iterdir()}:  # never a path from the request
            raise ApiError(404, "not found")
        return FileResponse(PAGE_DIR / name)


def _model_card(model_id: str, server: Server) -> dict:
    return {"id": model_id, "object": "model", "created": server.created, "owned_by": "whisperane"}
