"""A real `whisperane serve` process on 127.0.0.1 against the clients that used to wedge it: malformed WebSocket
frames, silent and slow clients, web pages from other origins, DNS rebinding, unbounded work, values no audio has.
After each, /health shows no slot held and a real transcription succeeds. Every client here is bounded in count
and time (socket timeouts; the server's own timeouts are set short)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
websockets = pytest.importorskip("websockets")

from served import ServeProcess, joined_clips  # noqa: E402
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data"
JFK = DATA / "jfk.flac"
IDLE_S, HEADER_S = 2.0, 2.0
ALLOWED_ORIGIN = "http://app.example"
SERVE_ARGS = ["--max-concurrency", "1", "--max-queue", "1", "--idle-timeout", str(IDLE_S), "--header-timeout",
              str(HEADER_S), "--min-upload-rate", "64", "--decode-timeout", "3", "--decode-time-ratio", "0",
              "--max-audio-minutes", "0.5", "--allow-origin", ALLOWED_ORIGIN, "--shutdown-grace", "3"]
MALFORMED = {"array": "[]", "number": "1", "null": "null", "string": '"end"', "not json": "end",
             "unknown type": '{"type": "nope"}', "empty": ""}


@pytest.fixture(scope="module")
def spool_parent(tmp_path_factory):
    return tmp_path_factory.mktemp("tmp")


@pytest.fixture(scope="module")
def server(tiny_en_bundle, spool_parent):
    process = ServeProcess(["--model", str(tiny_en_bundle), *SERVE_ARGS], env={"TMPDIR": str(spool_parent)})
    yield process
    assert process.stop() == 0


def _health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


def assert_recovered(server: ServeProcess) -> None:
    """No slot or live session held (waiting for the server to notice a client's end), and JFK transcribes."""
    deadline = time.monotonic() + 30
    while (health := _health(server.url))["admitted"] or health["live"]:
        assert time.monotonic() < deadline, f"a slot is still held: {health}"
        time.sleep(0.05)
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": JFK.open("rb")}, timeout=60)
    assert r.status_code == 200 and "ask not what your country can do for you" in r.json()["text"].lower()


def _live(server: ServeProcess, **kwargs):
    return connect(server.url.replace("http", "ws") + "/v1/audio/live", open_timeout=10, close_timeout=5, **kwargs)


def _pcm(seconds: float) -> bytes:
    return (np.zeros(int(16000 * seconds), dtype="<i2")).tobytes()


def _messages(ws, timeout: float = 30) -> list[dict]:
    """Every frame until the server closes (bounded)."""
    out, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            out.append(json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic()))))
    except websockets.ConnectionClosed:
        return out
    raise AssertionError(f"the server did not close the WebSocket within {timeout} s: {out}")


@pytest.mark.parametrize("frame", list(MALFORMED))
def test_a_malformed_text_frame_ends_the_session_with_1003(server, frame):
    with _live(server) as ws:
        ws.send(_pcm(0.3))
        ws.send(MALFORMED[frame])
        messages = _messages(ws)
        assert messages[-1]["type"] == "error" and messages[-1]["error"]["code"] == "unsupported_frame"
        assert ws.close_code == 1003 and "type" in ws.close_reason
    assert_recovered(server)


def test_an_odd_byte_before_the_end_still_finishes(server):
    with _live(server) as ws:
        ws.send(_pcm(1.0) + b"\x01")
        ws.send(json.dumps({"type": "end"}))
        assert _messages(ws)[-1]["type"] == "done" and ws.close_code == 1000
    assert_recovered(server)


def test_a_silent_websocket_is_closed_after_the_idle_timeout(server):
    with _live(server) as ws:
        start = time.monotonic()
        messages = _messages(ws, timeout=IDLE_S + 10)
        # the server's idle clock starts when its side of the handshake is done, a moment before the client's
        assert IDLE_S - 0.1 <= time.monotonic() - start < IDLE_S + 5
        assert messages[-1]["error"]["code"] == "idle_timeout" and ws.close_code == 1008
    assert_recovered(server)


def test_a_live_stream_over_the_audio_limit_is_closed(server):
    with _live(server) as ws:
        for _ in range(4):  # 40 s of silence, over the 30 s limit
            ws.send(_pcm(10.0))
        messages = _messages(ws)
        assert messages[-1]["error"]["code"] == "audio_too_long" and ws.close_code == 1008
    assert_recovered(server)


def test_foreign_origins_are_refused_and_listed_ones_get_cors(server):
    with pytest.raises(InvalidStatus) as refused:
        _live(server, origin="http://evil.example")
    assert refused.value.response.status_code == 403
    with _live(server, origin=f"http://127.0.0.1:{server.port}") as ws:  # the server's own page
        ws.send(json.dumps({"type": "end"}))
        assert _messages(ws)[-1]["type"] == "done"
    evil = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": JFK.open("rb")},
                      headers={"Origin": "http://evil.example"}, timeout=30)
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in evil.headers
    listed = httpx.get(server.url + "/v1/models", headers={"Origin": ALLOWED_ORIGIN}, timeout=10)
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    preflight = httpx.options(server.url + "/v1/audio/transcriptions", timeout=10, headers={
        "Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-headers"] == "authorization"
    assert httpx.options(server.url + "/v1/models", headers={"Origin": "http://evil.example",
                         "Access-Control-Request-Method": "GET"}, timeout=10).status_code == 403
    assert_recovered(server)


def test_a_rebound_host_name_is_refused(server):
    for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.nip.io"):
        r = httpx.get(server.url + "/v1/models", headers={"Host": host}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}"):
        assert httpx.get(server.url + "/v1/models", headers={"Host": host}, timeout=10).status_code == 200
    handshake = (b"GET /v1/audio/live HTTP/1.1\r\nHost: evil.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert _raw(server, handshake)[0].startswith(b"HTTP/1.1 403")
    assert_recovered(server)


def _raw(server: ServeProcess, head: bytes, pieces=(), pause: float = 0.0, timeout: float = 30) -> tuple[bytes, float]:
    """Send ``head`` then each of ``pieces`` ``pause`` s apart (stopping once the server has answered or closed);
    what it answered and when, from the start."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(head)
        s.setblocking(False)
        answer = b""
        for piece in [*pieces, None]:
            deadline = time.monotonic() + (pause if piece is not None else timeout)
            while time.monotonic() < deadline:
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    time.sleep(0.02)
                    continue
                except ConnectionResetError:
                    return answer, time.monotonic() - start
                if not data:
                    return answer, time.monotonic() - start
                answer += data
                if _whole_response(answer):
                    return answer, time.monotonic() - start
            if piece is not None:
                try:
                    s.sendall(piece)
                except (BrokenPipeError, ConnectionResetError):
                    return answer, time.monotonic() - start
    return answer, time.monotonic() - start


def _whole_response(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")]
    return bool(sep) and (not lengths or len(body) >= lengths[0])


def _upload_head(server: ServeProcess, length: int, boundary: str = "b0undary") -> bytes:
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n").encode()
    return (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: "
            f"multipart/form-data; boundary={boundary}\r\nContent-Length: {length}\r\n\r\n").encode() + part


def test_an_upload_that_stops_short_of_its_length_is_408(server, spool_parent):
    answer, held = _raw(server, _upload_head(server, 2**20) + b"\0" * 1000)
    assert answer.startswith(b"HTTP/1.1 408") and b"upload_timeout" in answer and held < IDLE_S + 5
    assert_recovered(server)
    spools = list(spool_parent.glob("whisperane-spool-*"))
    assert len(spools) == 1 and list(spools[0].iterdir()) == []  # the spooled part was removed


def test_a_trickling_upload_is_cut_off_by_the_rate(server):
    answer, held = _raw(server, _upload_head(server, 2**20), pieces=[b"\0" * 5] * 40, pause=0.25)
    assert answer.startswith(b"HTTP/1.1 408") and b"upload_too_slow" in answer and held < IDLE_S + 5
    assert_recovered(server)


def test_a_head_that_never_completes_is_closed(server):
    answer, held = _raw(server, b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                        pieces=[b"X-Slow: 1\r\n"] * 20, pause=0.5)
    assert answer == b"" and HEADER_S <= held < HEADER_S + 3
    answer, held = _raw(server, b"")  # a connection that sends nothing at all
    assert answer == b"" and held < HEADER_S + 3
    assert_recovered(server)


BOUNDS = {"beam_size": "1000", "batch_size": "100000"}


@pytest.mark.parametrize("field", list(BOUNDS))
def test_unbounded_work_is_400(server, field):
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": JFK.open("rb"), field: (None, BOUNDS[field])},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert_recovered(server)


def test_a_decode_over_its_budget_is_400(tiny_en_bundle, spool_parent):
    """A server whose budget (50 ms) no decode of JFK meets on any CPU (its encoder pass alone takes longer): the
    decode is stopped at its window's end and answered 400, its slot freed. (A prompt that makes the model repeat
    itself no longer reaches a budget: its loop stops where it starts, test_server.py.)"""
    args = list(SERVE_ARGS)
    args[args.index("--decode-timeout") + 1] = "0.05"
    process = ServeProcess(["--model", str(tiny_en_bundle), *args], env={"TMPDIR": str(spool_parent)})
    try:
        r = httpx.post(process.url + "/v1/audio/transcriptions", timeout=60, files={"file": JFK.open("rb")})
        assert r.status_code == 400 and r.json()["error"]["code"] == "decode_time_exceeded", r.text
        deadline = time.monotonic() + 30
        while _health(process.url)["admitted"]:
            assert time.monotonic() < deadline, "the stopped decode still holds its slot"
            time.sleep(0.05)
    finally:
        assert process.stop() == 0


def test_absurd_sample_values_are_400_at_once(server, tmp_path):
    path = tmp_path / "loud.wav"
    sf.write(str(path), np.full(16000 * 5, 1e19, dtype=np.float32), 16000, subtype="FLOAT")
    start = time.monotonic()
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": path.open("rb")}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_file" and time.monotonic() - start < 2
    assert_recovered(server)


def test_a_boundary_too_long_is_400(server):
    boundary = "b" * 300
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.flac\"\r\n\r\n").encode()
    body += JFK.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    r = httpx.post(server.url + "/v1/audio/transcriptions", content=body, timeout=30,
                   headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 400 and "boundary" in r.json()["error"]["message"]
    assert_recovered(server)


def _streamed_flac(source: Path, path: Path) -> None:
    """``source`` as a FLAC whose STREAMINFO says the length is unknown (total samples 0), as streaming encoders
    write it."""
    samples, rate = sf.read(str(source), dtype="int16")
    sf.write(str(path), samples, rate, format="FLAC")
    data = bytearray(path.read_bytes())
    info = 4 + 4  # "fLaC", then the STREAMINFO block's header
    data[info + 13] &= 0xF0  # the 36-bit total: the low nibble of byte 13 and bytes 14-17
    data[info + 14 : info + 18] = b"\0\0\0\0"
    path.write_bytes(bytes(data))


def test_a_streamed_flac_is_measured_by_decoding(server, tmp_path):
    joined = tmp_path / "long.wav"
    joined_clips([JFK] * 3, joined)  # 35 s, over the server's 30 s
    long_flac, short_flac = tmp_path / "long.flac", tmp_path / "short.flac"
    _streamed_flac(joined, long_flac)
    _streamed_flac(JFK, short_flac)
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": long_flac.open("rb")}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "audio_too_long"
    r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": short_flac.open("rb")}, timeout=30)
    assert r.status_code == 200 and "ask not what your country" in r.json()["text"].lower()
    assert_recovered(server)


def _stop_while(tiny_en_bundle, tmp_path, act) -> tuple[int, float, object]:
    """A server of its own, ``act(server)`` (returning its clients' outcome as a callable), SIGTERM, the exit code,
    the seconds from the signal to the exit, and the outcome."""
    server = ServeProcess(["--model", str(tiny_en_bundle), *SERVE_ARGS], env={"TMPDIR": str(tmp_path)})
    outcome = act(server)
    start = time.monotonic()
    code = server.stop(signal.SIGTERM)
    return code, time.monotonic() - start, outcome()


def test_sigterm_lets_a_running_request_finish(tiny_en_bundle, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1)

    def act(server):
        future = pool.submit(httpx.post, server.url + "/v1/audio/transcriptions", files={"file": JFK.open("rb")},
                             timeout=60)
        deadline = time.monotonic() + 30
        while not _health(server.url)["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        return future.result

    code, took, response = _stop_while(tiny_en_bundle, tmp_path, act)
    assert code == 0 and took < 3 + 5
    assert response.status_code == 200 and "ask not what your country" in response.json()["text"].lower()
    assert list(tmp_path.glob("whisperane-spool-*")) == []  # the spool directory removed with the process


def test_sigterm_stops_slow_clients_with_a_clear_answer(tiny_en_bundle, tmp_path):
    """A stuck upload (trickling fast enough to pass the rate check for a while) and a live stream: the stream
    gets its done and 1001 at once, the upload a 503 after the 3 s grace; the process exits 0 and leaves no
    spooled upload."""
    from concurrent.futures import ThreadPoolExecutor

    pool, clients = ThreadPoolExecutor(2), contextlib.ExitStack()

    def act(server):
        ws = clients.enter_context(_live(server))
        ws.send(_pcm(1.0))
        upload = pool.submit(_raw, server, _upload_head(server, 2**22), [b"\0" * 2**16] * 60, 0.5)
        deadline = time.monotonic() + 10
        while _health(server.url)["admitted"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)

        def outcome():
            messages = _messages(ws)
            return messages, ws.close_code, upload.result()

        return outcome

    stale = tmp_path / "whisperane-spool-999999999-x"  # a killed server's (no such pid): removed at start
    stale.mkdir()
    with clients:
        code, took, (messages, close_code, (answer, _)) = _stop_while(tiny_en_bundle, tmp_path, act)
    assert code == 0 and took < 3 + 5
    assert messages[-1]["type"] == "done" and close_code == 1001
    assert answer.startswith(b"HTTP/1.1 503") and b"server_shutting_down" in answer
    assert list(tmp_path.glob("whisperane-spool-*")) == []


def test_a_stopped_decode_leaves_its_frames_on_its_thread():
    """A cancelled job's exception reaches the event loop without the decode's frames (their buffers are freed,
    and trimmed, on the worker's thread: late frees from another thread grew the resident set by megabytes per
    cancelled request)."""
    import asyncio
    import traceback

    from whisperane.server.workers import Cancelled, DecodePool

    def decode(job):
        buffers = np.ones(2**20)  # noqa: F841 - what the decode's frame holds
        job.stop()
        job.check()

    slot = DecodePool(1, 0).reserve()
    with pytest.raises(Cancelled) as stopped:
        asyncio.run(slot.run(decode))
    assert "decode" not in [frame.name for frame in traceback.extract_tb(stopped.value.__traceback__)]
