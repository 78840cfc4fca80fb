"""The FastAPI app: OpenAI's audio routes, /v1/models, /health, the live WebSocket and the page.

Models are loaded once, before the app is made, and shared by every request; a request's ``model`` field only
picks among them by id (``whisper-1``: the first), so no request can make the server open a path or download.
Every error a client sees is OpenAI's ``{"error": {...}}`` with a 4xx status for what the client sent wrong
(the official client retries 5xx, uploading the file again), and no message holds a server path or a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from .. import OptionsError, WhisperaneError, WhisperaneModel, __version__
from ..audio import SAMPLE_RATE
from ..options import check_options_for_model
from ..result import TranscriptionResult
from ..transcribe import Transcription
from .access import AccessMiddleware
from .config import ServerConfig
from .deadlines import paced, shutting_down
from .models import Lease, ModelRegistry
from .openai_api import (
    ApiError,
    RequestOptions,
    Upload,
    decode_upload,
    options_error,
    read_upload,
    render,
    request_options,
    served_model_id,
    too_large,
    verbose_json,
)
from .scheduling import Schedule
from .sse import DeltaText, TranscriptStream
from .workers import Cancelled, Closed, DecodePool, Job, QueueFull, Slot
from .ws import LiveSession

__all__ = ["ServerConfig", "create_app"]

PAGE_DIR = Path(__file__).parent / "page"
LAST_WORDS_S = 2.0  # after the shutdown grace: how long stopped requests get to tell their clients so
log = logging.getLogger("whisperane.server")


def public_error(e: BaseException, upload: Upload | None = None) -> ApiError:
    """The ApiError a client sees for any exception of a decode."""
    if isinstance(e, Cancelled):
        return e.reason if isinstance(e.reason, ApiError) else ApiError(400, "the request was cancelled")
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
    """The app's state: the models by id, the config, the decode pool and the live sessions open now."""

    def __init__(self, models: dict[str, WhisperaneModel] | ModelRegistry, config: ServerConfig,
                 schedule: Schedule | None = None):
        self.models = models if isinstance(models, ModelRegistry) else ModelRegistry.of_loaded(models)
        self.config = config
        self.pool = DecodePool(config.workers, config.queue, schedule)
        self.created = int(time.time())
        self.stopping = asyncio.Event()  # set once the shutdown grace is over: every wait on a client ends
        self.live: set[LiveSession] = set()

    def reserve(self) -> Slot:
        try:
            return self.pool.reserve()
        except QueueFull:
            raise ApiError(503, "the server is busy: every worker and the queue are taken; retry later",
                           code="server_busy", headers={"Retry-After": str(self.config.retry_after_s)}) from None
        except Closed:
            raise shutting_down() from None

    def decode(self, job: Job, model: WhisperaneModel, upload: Upload, options: RequestOptions, on_audio=None,
               on_segment=None) -> TranscriptionResult:
        """One request's work, on a worker: the upload decoded (opened once, checked, its length bounding the job's
        time), ``on_audio()`` once it is accepted, then its transcription from the samples."""
        samples = decode_upload(upload, self.config.max_audio_seconds, job.check, self.config.decode_budget)
        seconds = len(samples) / SAMPLE_RATE
        budget = self.config.decode_budget(seconds)
        job.limit(budget, ApiError(400, f"the decode took longer than this server allows for {seconds:.1f} s of audio "
                                   f"({budget:.0f} s); a prompt that makes the model repeat itself can do this",
                                   code="decode_time_exceeded"))
        if on_audio is not None:
            on_audio()
        transcription = Transcription(model, samples, options.transcribe)
        for window in transcription:
            for segment in window.segments if on_segment else ():
                on_segment(segment)
            job.check()  # the decode stops at this window once stopped or over budget
        return transcription.result

    async def transcription(self, request: Request, task: str) -> Response:
        max_bytes = int(self.config.max_upload_mb * 2**20)
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_bytes + 2**20:
            raise too_large(max_bytes)  # refused from the header: the body is never read
        slot = self.reserve()
        upload: Upload | None = None
        lease: Lease | None = None
        try:
            body = paced(request.stream(), self.config, self.stopping)
            upload = await read_upload(request.headers.get("content-type"), body, max_bytes, self.config.spool_dir)
            options = request_options(upload, task, list(self.models))
            lease = await self.models.lease(options.model)  # the first request of an unloaded model loads it
            _check_options(options, lease.model)
            if options.stream:
                stream = self._stream(slot, upload, lease.model, options)
                stream.task.add_done_callback(lambda _, held=lease: held.release())
                slot = upload = lease = None  # the stream's job owns them now
                return await self._stream_response(request, stream)
            return await self._complete(request, slot, upload, lease.model, options, task)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it: the client has gone mid-upload
        finally:
            if upload is not None:
                upload.remove()
            if slot is not None:
                slot.release()
            if lease is not None:
                lease.release()

    async def _complete(self, request: Request, slot: Slot, upload: Upload, model: WhisperaneModel,
                        options: RequestOptions, task: str) -> Response:
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, slot))
        try:
            result = await slot.run(self.decode, model, upload, options)
        except Cancelled as e:
            if e.reason is None:
                return Response(status_code=400)  # the client has gone
            raise public_error(e) from None
        except Exception as e:  # noqa: BLE001 - every failure is answered in OpenAI's shape
            raise public_error(e, upload) from None
        finally:
            watch.cancel()
        body, media_type = render(result, options, task)
        if isinstance(body, dict):
            return JSONResponse(body)
        return PlainTextResponse(body, media_type=media_type)

    def _stream(self, slot: Slot, upload: Upload, model: WhisperaneModel, options: RequestOptions) -> TranscriptStream:
        tokenizer = model.tokenizer()
        run = lambda job, on_audio, on_segment: self.decode(job, model, upload, options, on_audio, on_segment)  # noqa: E731
        verbose = None
        if options.response_format == "verbose_json":
            verbose = lambda result: verbose_json(result, options, options.transcribe.task)  # noqa: E731
        stream = TranscriptStream(slot, run, DeltaText(tokenizer.decode, tokenizer.eot),
                                  lambda e: public_error(e, upload), verbose)
        stream.task.add_done_callback(lambda _: upload.remove())
        return stream

    @staticmethod
    async def _stream_response(request: Request, stream: TranscriptStream) -> Response:
        """The event stream once the upload's audio is accepted: one that is not audio or too long is a 400, not an
        event. A client gone before then stops the job (the response's own watch takes over after)."""
        watch = asyncio.ensure_future(_cancel_on_disconnect(request, stream.slot))
        try:
            await stream.audio_accepted()
        finally:
            watch.cancel()
        return StreamingResponse(stream.events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def drain(self) -> None:
        """The server is stopping: admit nothing more, finish the live streams with what they have, let running
        requests end within the grace, then stop the rest (their clients told so) and end every wait on a
        client."""
        self.pool.close()
        self.models.close()
        for session in list(self.live):
            session.finish_now()
        await self._settle(self.config.shutdown_grace_s)
        if self.pool.admitted:
            log.warning("stopping %d request(s) still running after the %g s grace", self.pool.admitted,
                        self.config.shutdown_grace_s)
        self.pool.stop_all(shutting_down())
        self.stopping.set()
        await self._settle(LAST_WORDS_S)

    async def _settle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.pool.admitted and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def _check_options(options: RequestOptions, model: WhisperaneModel) -> None:
    """400 for options no decode takes, or the request's model cannot (before any audio is read)."""
    try:
        check_options_for_model(options.transcribe, model.is_multilingual)
    except OptionsError as e:  # translation is what the model cannot do on its route; elsewhere, the language
        param = "model" if options.transcribe.task == "translate" else "language"
        raise ApiError(400, f"the model '{options.model}': {e}", param=param, code="invalid_option") from None


async def _cancel_on_disconnect(request: Request, slot: Slot) -> None:
    """Waits for the client to go (the body is read by then, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    slot.job.stop()


def create_app(models: dict[str, WhisperaneModel] | ModelRegistry, config: ServerConfig | None = None,
               schedule: Schedule | None = None) -> FastAPI:
    """The app over ``models`` (id -> loaded model, or a ``ModelRegistry`` that loads and unloads them; the first
    is ``whisper-1``), loaded by ``schedule`` (``Schedule.load_models``), whose requests its decode pool counts."""
    server = Server(models, config or ServerConfig(), schedule)
    app = FastAPI(title="whisperane", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_middleware(AccessMiddleware, config=server.config)
    _add_error_handlers(app)
    _add_routes(app, server)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, FastAPI's and Starlette's own (404, 405, validation) included."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return e.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return ApiError(e.status_code, str(e.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        return ApiError(400, "the request is malformed").response()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        return public_error(e).response()


def _add_routes(app: FastAPI, server: Server) -> None:
    @app.get("/health")
    async def health():
        return {"status": "stopping" if server.pool.closed else "ok", "models": list(server.models),
                "admitted": server.pool.admitted, "running": server.pool.running, "live": len(server.live),
                "capacity": server.pool.capacity, "cancelled": server.pool.cancelled}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [_model_card(i, server) for i in server.models]}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str):
        return _model_card(served_model_id(model_id, list(server.models)), server)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request):
        return await server.transcription(request, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request):
        return await server.transcription(request, "translate")

    @app.websocket("/v1/audio/live")
    async def live(websocket: WebSocket):
        await LiveSession.serve(websocket, server)

    @app.get("/")
    async def page():
        return FileResponse(PAGE_DIR / "index.html", media_type="text/html")

    @app.get("/page/{name}")
    async def page_file(name: str):
        if name not in {p.name for p in PAGE_DIR.iterdir()}:  # never a path from the request
            raise ApiError(404, "not found")
        return FileResponse(PAGE_DIR / name)


def _model_card(model_id: str, server: Server) -> dict:
    """OpenAI's model object, and what the page offers for it: the languages it transcribes (English-only models:
    English, and no translation); ``loaded``: whether it is in memory now (else its next request loads it)."""
    multilingual, languages = server.models.languages(model_id)
    return {"id": model_id, "object": "model", "created": server.created, "owned_by": "whisperane",
            "multilingual": multilingual, "languages": languages, "loaded": server.models.loaded(model_id)}
