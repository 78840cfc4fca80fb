"""A whisperane server on a free loopback port, in a thread of the test process (uvicorn, the real app)."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import numpy as np
import soundfile as sf

from whisperane.audio import load_audio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(models: dict, **config):
    """Yields the base URL (``http://127.0.0.1:PORT``) of the app over ``models``, stopped on exit."""
    import uvicorn

    from whisperane.server.app import ServerConfig, create_app

    app = create_app(models, ServerConfig(**config))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def joined_clips(paths: list, path, gap_s: float = 1.0) -> float:
    """Write the clips one after the other (16 kHz, ``gap_s`` of silence between) to ``path``; its duration."""
    gap = np.zeros(int(16000 * gap_s), dtype=np.float32)
    parts = []
    for p in paths:
        parts += [load_audio(str(p)), gap]
    audio = np.concatenate(parts[:-1])
    sf.write(str(path), audio, 16000, subtype="PCM_16")
    return len(audio) / 16000
