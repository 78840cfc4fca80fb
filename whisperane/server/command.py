"""``whisperane serve``: its flags and its entry (FastAPI, uvicorn and Ray are imported only when it runs)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from .. import WhisperaneError
from .config import MAX_BATCH_SIZE, MAX_BEAM_SIZE, WS_MAX_FRAME, WS_PING_INTERVAL_S

DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise: the server is reachable from this machine only
API_KEY_ENV = "WHISPERANE_API_KEY"
BOUNDS = (f"Fixed bounds: beam_size <= {MAX_BEAM_SIZE} and batch_size <= {MAX_BATCH_SIZE} per request, a prompt's last "
          f"223 tokens (as openai-whisper), WebSocket frames <= {WS_MAX_FRAME // 2**20} MiB and a ping every "
          f"{WS_PING_INTERVAL_S:g} s. Timeouts answer 408, bounds 400, a full queue or a stop 503.")


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible transcription server (HTTP, SSE, WebSocket, a page)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter, epilog=BOUNDS)
    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", action="append", default=None,
                   help="model name or bundle directory, loaded at start (see --lazy-load); repeat for several "
                        "(whisper-1: the first; tiny.en when none is named)")
    p.add_argument("--lazy-load", action="store_true",
                   help="load each model on its first request (that request waits) instead of at start")
    p.add_argument("--model-ttl", type=float, default=-1, metavar="SECONDS",
                   help="unload a model idle this long (never while a request or a live stream uses it; the next "
                        "request loads it again); -1: never, 0: as soon as it is idle")
    p.add_argument("--api-key", default=None, help=f"require Authorization: Bearer KEY (else ${API_KEY_ENV} when set)")
    p.add_argument("--max-concurrency", type=int, default=os.cpu_count() or 1,
                   help="decodes at once; one per core by default")
    p.add_argument("--threads-per-worker", type=int, default=1,
                   help="ONNX Runtime threads of each decode (the models' sessions are shared by the workers)")
    p.add_argument("--encoder-threads", type=int, default=None,
                   help="threads of the audio encoder, which runs one window at a time for all the workers, and "
                        "of a request's decoder while it runs alone (default: max-concurrency x threads-per-worker, "
                        "the cores the decodes use)")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond those (more: 503 + Retry-After)")
    p.add_argument("--max-upload-mb", type=float, default=25.0)
    p.add_argument("--max-audio-minutes", type=float, default=60.0, help="longest upload or live stream")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page origin (https://app.example) that may use the server besides its own page, with "
                        "CORS; repeat for several, '*' for any (others: 403)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a Host name the server may be reached by besides its bound address (and localhost when "
                        "that is loopback); repeat for several, '*' for any (others: refused, against DNS rebinding)")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds for a request's headers")
    p.add_argument("--idle-timeout", type=float, default=15.0,
                   help="seconds without upload progress or a WebSocket message before the client is cut off (408)")
    p.add_argument("--min-upload-rate", type=float, default=32.0,
                   help="KiB/s an upload must average once idle-timeout seconds have passed (else 408)")
    p.add_argument("--decode-timeout", type=float, default=30.0,
                   help="seconds a decode may take beyond decode-time-ratio x its audio's length (checked after "
                        "each 30 s window; past it: 400 decode_time_exceeded)")
    p.add_argument("--decode-time-ratio", type=float, default=1.0, help="seconds of decoding per second of audio")
    p.add_argument("--shutdown-grace", type=float, default=5.0,
                   help="on SIGTERM/SIGINT, seconds running requests get to finish before they are stopped (503)")
    p.add_argument("--ray-address", default=None, help="serve on Ray Serve at this cluster address ('auto', 'local')")
    p.add_argument("--replicas", type=int, default=2, help="Ray Serve replicas (each one loads the models)")


def server_config(args: argparse.Namespace):
    from .app import ServerConfig

    if min(args.max_concurrency, args.threads_per_worker, encoder_threads(args)) < 1 or args.max_queue < 0 or \
            args.max_upload_mb <= 0 or args.max_audio_minutes <= 0:
        raise WhisperaneError("--max-concurrency, --threads-per-worker and --encoder-threads must be >= 1, "
                              "--max-queue >= 0, the size and length limits > 0")
    timeouts = (args.header_timeout, args.idle_timeout, args.decode_timeout)
    if not all(0 < t < float("inf") for t in timeouts) or args.min_upload_rate < 0 or args.decode_time_ratio < 0 \
            or args.shutdown_grace < 0:
        raise WhisperaneError("--header-timeout, --idle-timeout and --decode-timeout must be > 0, "
                              "--min-upload-rate, --decode-time-ratio and --shutdown-grace >= 0")
    return ServerConfig(api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                        max_upload_mb=args.max_upload_mb, max_audio_minutes=args.max_audio_minutes,
                        workers=args.max_concurrency, queue=args.max_queue, host=args.host,
                        allow_hosts=tuple(h.lower() for h in args.allow_host), allow_origins=tuple(args.allow_origin),
                        header_timeout_s=args.header_timeout, idle_timeout_s=args.idle_timeout,
                        min_upload_kib_s=args.min_upload_rate, decode_timeout_s=args.decode_timeout,
                        decode_time_ratio=args.decode_time_ratio, shutdown_grace_s=args.shutdown_grace)


def encoder_threads(args: argparse.Namespace) -> int:
    return args.encoder_threads if args.encoder_threads is not None else args.max_concurrency * args.threads_per_worker


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise WhisperaneError(f"the server needs {e.name}: pip install 'whisperane[server]'") from None
    config = server_config(args)
    names = args.model or ["tiny.en"]
    if args.ray_address and (args.lazy_load or args.model_ttl != -1):
        raise WhisperaneError("--lazy-load and --model-ttl apply to a server of its own, not to Ray Serve's replicas")
    if args.ray_address:
        from .ray_serve import serve_on_ray

        try:
            return serve_on_ray(names, config, args.ray_address, args.replicas, args.host, args.port,
                                args.threads_per_worker, encoder_threads(args))
        except KeyboardInterrupt:  # Ray Serve's blocking run ends on Ctrl-C: a normal stop
            return 0
    from ..runtime.executors import map_large_allocations
    from .app import create_app
    from .lifecycle import spool_directory, uvicorn_server
    from .models import ModelRegistry
    from .scheduling import Schedule

    map_large_allocations()
    schedule = Schedule(args.threads_per_worker, encoder_threads(args))
    models = ModelRegistry(names, schedule.load_model, ttl=args.model_ttl, lazy=args.lazy_load)
    with spool_directory(config.spool_dir) as spool:
        uvicorn_server(create_app(models, replace(config, spool_dir=spool), schedule), args.host, args.port).run()
    return 0
