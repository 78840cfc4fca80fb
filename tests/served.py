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
def serving(models: dict, schedule=None, **config):
    """Yields the base URL (``http://127.0.0.1:PORT``) of the app over ``models`` (loaded by ``schedule``, where
    given), stopped on exit."""
    from whisperane.server.app import ServerConfig, create_app
    from whisperane.server.lifecycle import uvicorn_server

    port = free_port()
    app = create_app(models, ServerConfig(**config), schedule)
    server = uvicorn_server(app, "127.0.0.1", port, log_level="warning")
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


class ServeProcess:
    """``whisperane serve`` as a child process on a free loopback port (``url`` once /health answers)."""

    def __init__(self, args: list[str], env: dict | None = None):
        import os
        import subprocess
        import sys
        import tempfile

        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads would fill and block the server
        self.proc = subprocess.Popen([sys.executable, "-m", "whisperane", "serve", "--port", str(self.port), *args],
                                     env={**os.environ, **(env or {})}, stdout=self.log, stderr=self.log, text=True)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"whisperane serve exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("whisperane serve did not start")
            time.sleep(0.1)

    def stop(self, sig: int | None = None, timeout: float = 60) -> int:
        """Send ``sig`` (SIGTERM by default) and wait for the exit code (killed after ``timeout``)."""
        import signal
        import subprocess

        self.proc.send_signal(sig or signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def output(self) -> str:
        """What the process has written so far (its log)."""
        self.log.seek(0)
        return self.log.read()
