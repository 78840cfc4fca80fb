"""The clients of ``bench_soak.py``: the good traffic (normal requests, SSE streams, live WebSockets) and the bad
clients. Each client is a thread running one loop bounded in iterations and by the phase's deadline; every
socket has a timeout and every wait for the server is bounded, so a hung server shows up as an outcome
("open", a timeout), never as a hung soak. All traffic goes to 127.0.0.1.

Every request or stream becomes one record: ``kind``, ``answer`` (an HTTP status, ``close CODE``, ``closed``,
an exception's name...), ``seconds`` (latency, or how long the server held a bad client) and ``t`` (seconds
into the phase)."""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

HOST = "127.0.0.1"
PATH = "/v1/audio/transcriptions"
MAX_BAD = 8  # bad clients at once: with the default 2 + 16 admitted they alone can never exhaust the capacity
MIN_PAUSE = 0.05  # every loop pauses at least this long, so a server that refuses at once is not hammered
HOLD_SLACK = 5.0  # seconds past a timeout within which the server must have cut a bad client
WS_FRAME_S = 0.5
# The normal requests' formats, in turn: plain json without word timing (the cheap path), verbose_json with
# words (the DTW path) and srt.
FORMATS = (("json", {"response_format": "json", "word_timestamps": "false"}),
           ("verbose_json+words", {"response_format": "verbose_json", "timestamp_granularities[]": ["word"]}),
           ("srt", {"response_format": "srt"}))


@dataclass(frozen=True)
class Limits:
    """The server's timeouts, as the soak was told them (the spec's defaults otherwise)."""

    header_timeout: float = 10.0
    idle_timeout: float = 15.0

    @property
    def budget(self) -> float:
        """How long a bad client waits for the server to act before recording it as left open."""
        return max(self.header_timeout, self.idle_timeout) + 20.0


@dataclass
class Traffic:
    """What the clients share: the server, the phase's deadline, the stop flag and the records."""

    port: int
    seconds: float
    limits: Limits
    stop: threading.Event = field(default_factory=threading.Event)
    records: list = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.t0 + self.seconds

    def record(self, kind: str, answer, seconds: float, **extra) -> None:
        # list.append is atomic under the GIL: the client threads need no lock
        self.records.append({"kind": kind, "answer": str(answer), "seconds": round(seconds, 3),
                             "t": round(time.monotonic() - self.t0, 1), **extra})

    def loop(self, name: str, one: Callable[[int], None], pause: float) -> None:
        """``one(i)`` over and over until the phase ends; bounded in count as well as in time."""
        for i in range(int(self.seconds / MIN_PAUSE) + 1):
            if not self.running():
                return
            try:
                one(i)
            except Exception as e:  # an answer the client did not foresee must not end the client
                self.record(f"{name}: client error", type(e).__name__, 0.0)
            self.stop.wait(max(pause, MIN_PAUSE))


@dataclass(frozen=True)
class Audio:
    """What the clients send, read once: short clips, the 20-30 s file for SSE, JFK as PCM, a 1e19 float WAV."""

    clips: list[tuple[str, bytes]]
    long_wav: bytes
    jfk_pcm: bytes
    huge_wav: bytes


def float_wav(value: float, seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A mono 32-bit float WAV whose every sample is ``value``: written by hand because writers clip or refuse."""
    n = int(seconds * rate)
    data = struct.pack(f"<{n}f", *([value] * n))
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)  # format 3: IEEE float
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + len(data)) + b"WAVE" + b"fmt " +
            struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data)


# --- the good traffic -----------------------------------------------------------------------------------------


def normal_client(traffic: Traffic, audio: Audio, k: int, think: float) -> None:
    """Short clips one after another, the formats in turn; every answer is expected to be 200."""
    with httpx.Client(base_url=traffic.url, timeout=httpx.Timeout(120, connect=10)) as client:
        def one(i: int) -> None:
            name, data = audio.clips[(k * 7 + i) % len(audio.clips)]
            fmt, fields = FORMATS[(k + i) % len(FORMATS)]
            t0 = time.monotonic()
            try:
                r = client.post(PATH, files={"file": (name, data)}, data={"model": "whisper-1", **fields})
                answer = r.status_code
            except httpx.HTTPError as e:
                answer = type(e).__name__
            traffic.record("normal", answer, time.monotonic() - t0, format=fmt)

        traffic.loop("normal", one, think)


def sse_client(traffic: Traffic, audio: Audio, abort_every: int, think: float) -> None:
    """``stream=true`` on the long file read to its done event; every ``abort_every``-th left after its first delta."""
    with httpx.Client(base_url=traffic.url, timeout=httpx.Timeout(60, connect=10)) as client:
        def one(i: int) -> None:
            abort = abort_every > 0 and i % abort_every == abort_every - 1
            t0 = time.monotonic()
            try:
                with client.stream("POST", PATH, files={"file": ("long.wav", audio.long_wav)},
                                   data={"model": "whisper-1", "stream": "true", "word_timestamps": "false"}) as r:
                    answer = _sse_outcome(r, abort, t0 + 120) if r.status_code == 200 else r.status_code
            except httpx.HTTPError as e:
                answer = type(e).__name__
            traffic.record("sse abort" if abort else "sse", answer, time.monotonic() - t0)

        traffic.loop("sse", one, think)


def _sse_outcome(r: httpx.Response, abort: bool, deadline: float) -> str:
    for line in r.iter_lines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:])
        if "error" in event:
            error = event["error"]
            return f"error event {error.get('code') if isinstance(error, dict) else error}"
        kind = event.get("type")
        if kind == "transcript.text.done":
            return "done"
        if kind == "transcript.text.delta" and abort:
            return "aborted after first delta"  # leaving the with-block closes the connection mid-stream
        if time.monotonic() > deadline:
            return "too slow"
    return "ended without done"


def ws_client(traffic: Traffic, audio: Audio, speed: float, think: float) -> None:
    """JFK's PCM in 0.5 s frames at ``speed`` x real time, then end; read to done and the close (1000 expected)."""
    frame = int(WS_FRAME_S * 16000) * 2

    def one(i: int) -> None:
        t0 = time.monotonic()
        try:
            with connect(f"ws://{HOST}:{traffic.port}/v1/audio/live?model=whisper-1", open_timeout=10,
                         close_timeout=5, proxy=None) as ws:
                for off in range(0, len(audio.jfk_pcm), frame):
                    ws.send(audio.jfk_pcm[off : off + frame])
                    _drain(ws)
                    time.sleep(WS_FRAME_S / speed)
                ws.send(json.dumps({"type": "end"}))
                answer = ws_until_close(ws, t0, 60)
        except ConnectionClosed as e:
            answer = f"close {e.rcvd.code if e.rcvd else 1006} while sending"
        except (OSError, InvalidHandshake) as e:
            answer = type(e).__name__
        traffic.record("ws", answer, time.monotonic() - t0)

    traffic.loop("ws", one, think)


def _drain(ws) -> None:
    """Take the events that already arrived, so that the client's receive queue never pauses the server's sends."""
    for _ in range(1000):
        try:
            ws.recv(timeout=0)
        except TimeoutError:
            return


def ws_until_close(ws, t0: float, budget: float) -> str:
    """Read until the server closes (to ``t0 + budget``): ``[done, ]close CODE``, or ``open`` if it never did."""
    done = error = False
    for _ in range(10000):
        left = t0 + budget - time.monotonic()
        if left <= 0:
            break
        try:
            message = ws.recv(timeout=left)
        except TimeoutError:
            break
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else 1006  # 1006: the connection dropped without a close frame
            return f"{'done, ' if done else 'error, ' if error else ''}close {code}"
        if isinstance(message, str):
            kind = json.loads(message).get("type")
            done, error = done or kind == "done", error or kind == "error"
    return "open" + (" after done" if done else "")


# --- the bad clients ------------------------------------------------------------------------------------------


def _request(traffic: Traffic, data: bytes, **headers: str) -> tuple[bytes, bytes]:
    """A transcription request's head and multipart body, byte for byte as httpx would send them."""
    req = httpx.Request("POST", traffic.url + PATH, files={"file": ("clip.flac", data)}, data={"model": "whisper-1"})
    body = req.read()
    lines = [f"POST {PATH} HTTP/1.1", f"Host: {HOST}:{traffic.port}", f"Content-Type: {req.headers['content-type']}",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode(), body


def _answer(sock: socket.socket, t0: float, budget: float) -> str:
    """The server's reaction by ``t0 + budget``: its status (``408``), ``closed``, ``reset``, or ``open``."""
    for _ in range(int(budget) + 2):  # each turn waits a second, or what is left of the budget
        if (left := t0 + budget - time.monotonic()) <= 0:
            break
        sock.settimeout(min(left, 1.0))
        try:
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return "reset"
        if not data:
            return "closed"
        return data.split()[1].decode(errors="replace") if data.startswith(b"HTTP/") and len(data.split()) > 1 \
            else "garbage"
    return "open"


def _raw(traffic: Traffic, send: Callable[[socket.socket, float], str]) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        with socket.create_connection((HOST, traffic.port), timeout=10) as sock:
            answer = send(sock, t0)
    except OSError as e:
        answer = type(e).__name__
    return answer, time.monotonic() - t0


def abort_mid_body(traffic: Traffic, audio: Audio) -> tuple[str, float]:
    head, body = _request(traffic, audio.long_wav)

    def send(sock, t0):
        sock.sendall(head + body[: len(body) // 2])
        return "aborted"  # closing here leaves the server with half a body

    return _raw(traffic, send)


def abort_while_decoding(traffic: Traffic, audio: Audio) -> tuple[str, float]:
    head, body = _request(traffic, audio.long_wav)

    def send(sock, t0):
        sock.sendall(head + body)
        answer = _answer(sock, time.monotonic(), 0.3)  # long enough for the decode to have started
        return "aborted" if answer == "open" else f"answered {answer} first"

    return _raw(traffic, send)


def slow_upload(traffic: Traffic, audio: Audio) -> tuple[str, float]:
    """A whole request's body trickled 8 bytes a second: progress, but far under any sane minimum rate."""
    head, body = _request(traffic, audio.clips[0][1])

    def send(sock, t0):
        sock.sendall(head)
        for off in range(0, len(body), 8):
            if time.monotonic() - t0 > traffic.limits.budget:
                return "open"
            try:
                sock.sendall(body[off : off + 8])
            except OSError:  # the server closed: its 408 may still be readable
                return _answer(sock, time.monotonic(), 2.0)
            if select.select([sock], [], [], 1.0)[0]:
                return _answer(sock, t0, traffic.limits.budget)
        return _answer(sock, t0, traffic.limits.budget)

    return _raw(traffic, send)


def short_body(traffic: Traffic, audio: Audio) -> tuple[str, float]:
    """Content-Length promises the whole body, half is sent, then silence."""
    head, body = _request(traffic, audio.clips[0][1])

    def send(sock, t0):
        sock.sendall(head + body[: len(body) // 2])
        return _answer(sock, t0, traffic.limits.budget)

    return _raw(traffic, send)


def half_request_line(traffic: Traffic, audio: Audio) -> tuple[str, float]:
    def send(sock, t0):
        sock.sendall(f"POST {PATH} HT".encode())
        return _answer(sock, t0, traffic.limits.budget)

    return _raw(traffic, send)


def _ws(traffic: Traffic, frames: list, origin: str | None = None) -> tuple[str, float]:
    """A live WebSocket that sends ``frames`` then waits for the server's close; ``end`` is sent after ``settle``
    seconds so that a server ignoring a bad frame still finishes."""
    t0 = time.monotonic()
    try:
        with connect(f"ws://{HOST}:{traffic.port}/v1/audio/live?model=whisper-1", open_timeout=10, close_timeout=5,
                     proxy=None, origin=origin) as ws:
            for frame in frames:
                ws.send(frame)
            if not frames:  # the idle client: never sends anything
                return ws_until_close(ws, t0, traffic.limits.budget), time.monotonic() - t0
            answer = ws_until_close(ws, t0, 3.0)
            if answer.startswith("open"):
                ws.send(json.dumps({"type": "end"}))
                answer = "end after 3 s; " + ws_until_close(ws, t0, traffic.limits.budget)
    except InvalidHandshake as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        answer = f"handshake {status}" if status else type(e).__name__
    except (OSError, ConnectionClosed) as e:
        answer = type(e).__name__
    return answer, time.monotonic() - t0


def _post(traffic: Traffic, data: bytes, fields: dict | None = None, **headers: str) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        answer = str(httpx.post(traffic.url + PATH, files={"file": ("clip.wav", data)}, headers=headers,
                                data={"model": "whisper-1", **(fields or {})}, timeout=traffic.limits.budget)
                     .status_code)
    except httpx.HTTPError as e:
        answer = type(e).__name__
    return answer, time.monotonic() - t0


END = json.dumps({"type": "end"})
# kind: (client, the answers counted as expected (an answer matches when it ends with one), the timeout that bounds
# how long the server may hold it: "idle" or "header", plus HOLD_SLACK; None: no bound).
BAD_KINDS: dict[str, tuple[Callable[[Traffic, Audio], tuple[str, float]], tuple[str, ...], str | None]] = {
    # slow kinds (holding a client for a timeout) spread between quick ones, so a short soak still meets them all
    "slow upload": (slow_upload, ("408", "closed", "reset"), "idle"),
    "ws text []": (lambda t, a: _ws(t, ["[]"]), ("close 1003",), None),
    "beam_size 1000": (lambda t, a: _post(t, a.clips[0][1], {"beam_size": "1000"}), ("400",), None),
    "abort mid-body": (abort_mid_body, ("aborted",), None),
    "evil origin": (lambda t, a: _post(t, a.clips[0][1], Origin="http://evil.example"), ("403",), None),
    "short body": (short_body, ("408", "closed", "reset"), "idle"),
    "ws text 1": (lambda t, a: _ws(t, ["1"]), ("close 1003",), None),
    "float wav 1e19": (lambda t, a: _post(t, a.huge_wav), ("400",), None),
    "ws odd-byte frame + end": (lambda t, a: _ws(t, [b"\x01\x02\x03", END]), ("done, close 1000",), None),
    "half request line": (half_request_line, ("400", "408", "closed", "reset"), "header"),
    "ws text null": (lambda t, a: _ws(t, ["null"]), ("close 1003",), None),
    "bad host": (lambda t, a: _post(t, a.clips[0][1], Host="evil.example"), ("400", "403"), None),
    "abort while decoding": (abort_while_decoding, ("aborted",), None),
    "idle ws": (lambda t, a: _ws(t, []), ("close 1008",), "idle"),
    "ws text not json": (lambda t, a: _ws(t, ["not json"]), ("close 1003",), None),
    # a JSON object of an unknown type: the spec names no answer; a refusal or ignoring it both pass
    'ws text {"type":"nope"}': (lambda t, a: _ws(t, ['{"type": "nope"}']), ("close 1003", "done, close 1000"), None),
    "ws evil origin": (lambda t, a: _ws(t, [END], origin="http://evil.example"), ("handshake 403",), None),
}


def as_expected(kind: str, answer: str, seconds: float, limits: Limits) -> bool:
    _, answers, timeout = BAD_KINDS[kind]
    limit = {"idle": limits.idle_timeout, "header": limits.header_timeout}.get(timeout or "")
    return answer.endswith(answers) and (limit is None or seconds <= limit + HOLD_SLACK)


def bad_client(traffic: Traffic, audio: Audio, k: int, n: int, pause: float, kinds: list[str]) -> None:
    """The bad ``kinds`` in turn, one at a time; client ``k`` of ``n`` starts ``k / n`` of the way through them."""

    def one(i: int) -> None:
        kind = kinds[(k * len(kinds) // n + i) % len(kinds)]
        answer, seconds = BAD_KINDS[kind][0](traffic, audio)
        traffic.record(kind, answer, seconds, expected=as_expected(kind, answer, seconds, traffic.limits))

    traffic.loop("bad", one, pause)
