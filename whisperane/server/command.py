"""``whisperane serve``: its flags and its entry (FastAPI, uvicorn and Ray are imported only when it runs)."""

from __future__ import annotations

import argparse
import os

from .. import WhisperaneError

DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise: the server is reachable from this machine only
API_KEY_ENV = "WHISPERANE_API_KEY"


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible transcription server (HTTP, SSE, WebSocket, a page)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--host", default=DEFAULT_HOST, help="address to bind (0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", action="append", default=None,
                   help="model name or bundle directory, loaded at start; repeat for several (whisper-1: the first; "
                        "tiny.en when none is named)")
    p.add_argument("--api-key", default=None, help=f"require Authorization: Bearer KEY (else ${API_KEY_ENV} when set)")
    p.add_argument("--max-concurrency", type=int, default=os.cpu_count() or 1,
                   help="decodes at once; one per core by default")
    p.add_argument("--threads-per-worker", type=int, default=1,
                   help="ONNX Runtime threads of each decode (the models' sessions are shared by the workers)")
    p.add_argument("--encoder-threads", type=int, default=None,
                   help="threads of the audio encoder, which runs one window at a time for all the workers "
                        "(default: max-concurrency x threads-per-worker, the cores the decodes use)")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond those (more: 503 + Retry-After)")
    p.add_argument("--max-upload-mb", type=float, default=25.0)
    p.add_argument("--max-audio-minutes", type=float, default=60.0)
    p.add_argument("--ray-address", default=None, help="serve on Ray Serve at this cluster address ('auto', 'local')")
    p.add_argument("--replicas", type=int, default=2, help="Ray Serve replicas (each one loads the models)")


def server_config(args: argparse.Namespace):
    from .app import ServerConfig

    if min(args.max_concurrency, args.threads_per_worker, encoder_threads(args)) < 1 or args.max_queue < 0 or \
            args.max_upload_mb <= 0 or args.max_audio_minutes <= 0:
        raise WhisperaneError("--max-concurrency, --threads-per-worker and --encoder-threads must be >= 1, "
                              "--max-queue >= 0, the size and length limits > 0")
    return ServerConfig(api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
                        max_upload_mb=args.max_upload_mb, max_audio_minutes=args.max_audio_minutes,
                        workers=args.max_concurrency, queue=args.max_queue)


def encoder_threads(args: argparse.Namespace) -> int:
    return args.encoder_threads if args.encoder_threads is not None else args.max_concurrency * args.threads_per_worker


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise WhisperaneError(f"the server needs {e.name}: pip install 'whisperane[server]'") from None
    config = server_config(args)
    names = args.model or ["tiny.en"]
    if args.ray_address:
        from .ray_serve import serve_on_ray

        try:
            return serve_on_ray(names, config, args.ray_address, args.replicas, args.host, args.port,
                                args.threads_per_worker, encoder_threads(args))
        except KeyboardInterrupt:  # Ray Serve's blocking run ends on Ctrl-C: a normal stop
            return 0
    from ..runtime.executors import map_large_allocations
    from .app import create_app
    from .models import load_models

    map_large_allocations()
    app = create_app(load_models(names, args.threads_per_worker, encoder_threads(args)), config)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", ws="websockets-sansio")
    return 0
