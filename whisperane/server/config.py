"""What a server takes from its command line: capacity, access, and the deadlines and bounds every client meets.

A client owes the server its headers, its upload and its WebSocket messages within these deadlines, and a request
may make the server do only so much work; the defaults are stated in ``whisperane serve --help`` and docs/GUIDE.md.
"""

from __future__ import annotations

from dataclasses import dataclass

# The most a request may ask of one decode: each beam holds its own decoder cache (about 9 MB with tiny.en, more
# with larger models), each batched lane a window's encoder activations.
MAX_BEAM_SIZE = 10
MAX_BATCH_SIZE = 16
WS_MAX_FRAME = 2**20  # 32 s of PCM in one WebSocket frame; a larger one is closed with 1009
WS_PING_INTERVAL_S = 20.0  # uvicorn's pings find dead peers (one not answering within as long is dropped)


@dataclass(frozen=True)
class ServerConfig:
    api_key: str | None = None
    max_upload_mb: float = 25.0
    max_audio_minutes: float = 60.0
    workers: int = 2  # decodes at once, one ONNX Runtime thread each
    queue: int = 16  # requests admitted beyond the workers (more are answered 503 at once)
    retry_after_s: int = 2
    spool_dir: str | None = None  # where uploads are written while they are decoded (default: the system's)
    # Access: the address the server is bound to, and what browsers may reach it as (see access.py).
    host: str = "127.0.0.1"
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()
    # Deadlines (seconds): for a request's headers, between pieces of an upload or WebSocket messages, and the
    # least average rate an upload keeps once idle_timeout_s has passed (KiB/s).
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    min_upload_kib_s: float = 32.0
    # A decode may take decode_timeout_s plus decode_time_ratio seconds per second of audio (checked per window).
    decode_timeout_s: float = 30.0
    decode_time_ratio: float = 1.0
    shutdown_grace_s: float = 5.0

    def decode_budget(self, audio_seconds: float) -> float:
        return self.decode_timeout_s + self.decode_time_ratio * audio_seconds

    @property
    def max_audio_seconds(self) -> float:
        return self.max_audio_minutes * 60
