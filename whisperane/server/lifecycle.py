"""The server process: uvicorn with a deadline for request headers, a stop that drains, and its spool directory.

- Headers: uvicorn closes a connection idle between requests (``--timeout-keep-alive``) but waits for ever on a
  request head that trickles in or never completes; ``head_deadline_protocol`` closes a connection that has not
  sent a whole head within the header timeout of its opening, or of its previous response.
- SIGTERM / SIGINT: the app's ``drain`` first (nothing more admitted, live streams finished with what they have,
  running requests given the grace, then stopped with a 503 or an error frame), then uvicorn's own shutdown; the
  process exits 0 (uvicorn would re-raise the signal and die by it).
- Uploads are spooled in a directory of the process's own, removed when it stops; one left by a process that was
  killed (SIGKILL leaves no chance to clean) is removed by the next server to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .config import WS_MAX_FRAME, WS_PING_INTERVAL_S

SPOOL_PREFIX = "whisperane-spool-"
GRACE_AFTER_DRAIN_S = 1  # uvicorn's own shutdown, after the app has told its clients


def head_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on each request head."""

    class HeadDeadlineProtocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_deadline()

        def connection_lost(self, exc) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            self.head_timer = self.loop.call_later(seconds, self._head_overdue)

        def _head_overdue(self) -> None:
            self.head_timer = None
            waiting = self.cycle is None or self.cycle.response_complete  # no request under way on it
            if waiting and self.transport.get_protocol() is self and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineProtocol


class DrainingServer(uvicorn.Server):
    """uvicorn's server that lets the app drain before its own shutdown, and exits normally on a signal."""

    def __init__(self, config: uvicorn.Config, app_server):
        super().__init__(config)
        self.app_server = app_server

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()  # no new connections while the app drains
        await self.app_server.drain()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def uvicorn_server(app, host: str, port: int, log_level: str = "info") -> DrainingServer:
    """The server for ``app`` (made by ``create_app``), with its config's header deadline."""
    config = app.state.server.config
    return DrainingServer(uvicorn.Config(
        app, host=host, port=port, log_level=log_level, ws="websockets-sansio", ws_max_size=WS_MAX_FRAME,
        ws_ping_interval=WS_PING_INTERVAL_S, ws_ping_timeout=WS_PING_INTERVAL_S,
        http=head_deadline_protocol(config.header_timeout_s), timeout_graceful_shutdown=GRACE_AFTER_DRAIN_S,
    ), app.state.server)


@contextlib.contextmanager
def spool_directory(parent: str | None = None) -> Iterator[str]:
    """A directory for this process's uploads, removed on exit; those of dead servers are removed first."""
    parent = parent or tempfile.gettempdir()
    for stale in Path(parent).glob(SPOOL_PREFIX + "*"):
        pid = stale.name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
