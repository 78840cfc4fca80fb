"""whisperane serve through the official openai client against a server on a free loopback port (real tiny.en
and base, real speech): every response format equals `whisperane transcribe`'s output, streams, errors in
OpenAI's shape, disconnects, concurrency."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from served import joined_clips, serving  # noqa: E402

import whisperane  # noqa: E402
from whisperane.audio import load_audio  # noqa: E402
from whisperane.command import main as cli_main  # noqa: E402

DATA = Path(__file__).parent / "data"
JFK = DATA / "jfk.flac"
ENGLISH = [DATA / n for n in ("jfk.flac", "1089-134686-0001.flac", "1089-134691-0000.flac", "1089-134691-0001.flac",
                              "LJ001-0002.flac", "LJ001-0008.flac")]
UPLOAD_MB = 4
NO_WORDS = {"word_timestamps": "false"}  # whisperane's own form field: where words are not what is tested


@pytest.fixture(scope="module")
def schedule():
    """As `whisperane serve` schedules its two workers: each decode on one thread, the encoder (one window at a
    time) on two."""
    from whisperane.server.scheduling import Schedule

    return Schedule(threads=1, encoder_threads=2)


@pytest.fixture(scope="module")
def models(schedule, tiny_en_bundle, base_bundle):
    return {name: schedule.load_model(bundle) for name, bundle in (("tiny.en", tiny_en_bundle), ("base", base_bundle))}


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    return tmp_path_factory.mktemp("spool")


@pytest.fixture(scope="module")
def url(models, schedule, spool):
    with serving(models, schedule, workers=2, queue=16, max_upload_mb=UPLOAD_MB, max_audio_minutes=1, spool_dir=str(spool)) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def cli_outputs(tiny_en_bundle, tmp_path_factory):
    """`whisperane transcribe -f all` of the JFK clip with the same bundle and one thread (the reference)."""
    out = tmp_path_factory.mktemp("cli")
    assert cli_main(["transcribe", str(JFK), "-f", "all", "-o", str(out), "--model", str(tiny_en_bundle),
                     "--threads", "1"]) == 0
    return {ext: (out / f"jfk.{ext}").read_text(encoding="utf-8") for ext in ("json", "srt", "vtt")}


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    """45.7 s of speech (two windows): three JFK clips with LibriSpeech clips between them."""
    path = tmp_path_factory.mktemp("long") / "long.wav"
    joined_clips([JFK, ENGLISH[3], JFK, ENGLISH[1], JFK], path)
    return path


def healthy(url: str) -> dict:
    r = httpx.get(url + "/health")
    assert r.status_code == 200
    return r.json()


def settled(url: str) -> dict:
    """/health once no request is admitted any more (a guard against a hang, not a timing)."""
    deadline = time.monotonic() + 60
    while (health := healthy(url))["admitted"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return health


def test_each_response_format_equals_the_cli(client, cli_outputs, spool):
    cli = json.loads(cli_outputs["json"])
    text = client.audio.transcriptions.create(model="whisper-1", file=JFK.open("rb"), response_format="text")
    assert text == cli["text"]
    assert client.audio.transcriptions.create(model="tiny.en", file=JFK.open("rb")).text == cli["text"]
    assert client.audio.transcriptions.create(model="whisper-1", file=JFK.open("rb"), response_format="srt") == cli_outputs["srt"]
    assert client.audio.transcriptions.create(model="whisper-1", file=JFK.open("rb"), response_format="vtt") == cli_outputs["vtt"]
    verbose = client.audio.transcriptions.create(model="whisper-1", file=JFK.open("rb"), response_format="verbose_json",
                                                 timestamp_granularities=["word", "segment"])
    assert verbose.text == cli["text"] and verbose.language == "english" and verbose.duration == cli["duration"]
    assert [s.text for s in verbose.segments] == [s["text"] for s in cli["segments"]]
    assert [w.word for w in verbose.words] == [w["word"] for s in cli["segments"] for w in s["words"]]
    starts = [s.start for s in verbose.segments]
    assert starts == sorted(starts) and all(0 <= s.start <= s.end <= verbose.duration for s in verbose.segments)
    times = [t for w in verbose.words for t in (w.start, w.end)]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= verbose.duration
    assert list(spool.iterdir()) == []  # every upload removed


@pytest.mark.slow
def test_translation_on_the_multilingual_model(client, models):
    de = DATA / "test_de.wav"  # "Der hinter diesem Portal liegenden Raum wurde als Leichenhalle genutzt."
    english = client.audio.translations.create(model="base", file=de.open("rb"), extra_body=NO_WORDS)
    assert english.text == models["base"].transcribe(str(de), task="translate", word_timestamps=False).text
    words = set(_words(english.text))
    assert english.text.isascii() and {"the", "used"} <= words and not {"der", "wurde", "diesem", "als"} & words


@pytest.mark.slow
def test_stream_deltas_concatenate_to_the_done_text(client, long_file, models):
    events = list(client.audio.transcriptions.create(model="whisper-1", file=long_file.open("rb"), stream=True,
                                                     extra_body=NO_WORDS))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert [e.type for e in events[len(deltas):]] == ["transcript.text.done"]
    assert len(deltas) >= 2  # one per kept segment, from both windows
    assert "".join(deltas) == events[-1].text == models["tiny.en"].transcribe(str(long_file), word_timestamps=False).text


@pytest.fixture(scope="module")
def quiet_then_loud(tmp_path_factory):
    """49 s: two clips whispered (at 2 %), then the same at full scale. Its first window's log-mel is floored
    from the file's peak (openai-whisper's pass over the whole file), not its own: read as a stream, whose
    windows keep their own peaks, the transcript differs."""
    path = tmp_path_factory.mktemp("quiet") / "quiet_then_loud.wav"
    jfk, hour, pause = load_audio(str(JFK)), load_audio(str(ENGLISH[3])), np.zeros(8 * 16000, np.float32)
    sf.write(str(path), np.concatenate([jfk * 0.02, pause, hour * 0.02, pause, jfk, hour]), 16000, subtype="PCM_16")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", [{}, {"vad_filter": "true"}, {"batch_size": "4"}], ids=["default", "vad", "batched"])
def test_an_upload_is_opened_once_and_transcribed_as_the_cli_does(url, spool, quiet_then_loud, models, mode,
                                                                 monkeypatch):
    """Every open of a file goes through audio.open_soundfile (open_audio, and a length counted by decoding): the
    server's audio check and its transcription share one decode of the upload, which gives the transcript
    transcribe() gives the file's path (the CLI's)."""
    import whisperane.audio

    opened, real = [], whisperane.audio.open_soundfile
    monkeypatch.setattr(whisperane.audio, "open_soundfile", lambda name: (opened.append(name), real(name))[1])
    r = httpx.post(url + "/v1/audio/transcriptions", timeout=120,
                   files={"file": quiet_then_loud.open("rb"), **_form(response_format="text", **NO_WORDS, **mode)})
    assert r.status_code == 200, r.text
    assert len([name for name in opened if name.startswith(str(spool))]) == 1
    options = {k: v == "true" if v in ("true", "false") else int(v) for k, v in {**NO_WORDS, **mode}.items()}
    monkeypatch.undo()
    assert r.text == models["tiny.en"].transcribe(str(quiet_then_loud), **options).text
    if not mode:  # the file tells the two readings apart
        with whisperane.audio.open_audio(quiet_then_loud) as stream:
            assert models["tiny.en"].transcribe(stream, **options).text != r.text


ENGLISH_ONLY = {
    "translate": ("/v1/audio/translations", {}, "model", "English-only models cannot translate"),
    "german": ("/v1/audio/transcriptions", {"language": "de"}, "language", "English-only models transcribe English only"),
    "german, streamed": ("/v1/audio/transcriptions", {"language": "de", "stream": "true"}, "language", "English only"),
}


@pytest.mark.parametrize("case", list(ENGLISH_ONLY))
def test_what_an_english_only_model_cannot_do_is_400_before_any_audio_is_read(url, case, spool):
    route, fields, param, message = ENGLISH_ONLY[case]
    r = httpx.post(url + route, files={"file": JFK.open("rb"), **_form(model="tiny.en", **fields)}, timeout=60)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"] and "'tiny.en'" in error["message"]
    assert settled(url)["admitted"] == 0 and list(spool.iterdir()) == []


def test_models_list(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny.en", "base"]
    assert client.models.retrieve("whisper-1").id == "whisper-1"


def _form(**fields):
    return {k: (None, v) for k, v in fields.items()}


BAD_REQUESTS = {
    "unknown response_format": (400, "response_format", lambda: {"files": {"file": JFK.open("rb"), **_form(model="whisper-1", response_format="docx")}}),
    "missing file": (400, "file", lambda: {"files": _form(model="whisper-1")}),
    "not audio": (400, "file", lambda: {"files": {"file": ("clip.wav", b"RIFF but not a wave at all" * 10), **_form(model="whisper-1")}}),
    "unknown option": (400, "speed", lambda: {"files": {"file": JFK.open("rb"), **_form(model="whisper-1", speed="2")}}),
    "bad option value": (400, "beam_size", lambda: {"files": {"file": JFK.open("rb"), **_form(beam_size="many")}}),
    "invalid language": (400, None, lambda: {"files": {"file": JFK.open("rb"), **_form(language="klingon")}}),
    "unknown model": (404, "model", lambda: {"files": {"file": JFK.open("rb"), **_form(model="/etc/passwd")}}),
    "not multipart": (400, "file", lambda: {"json": {"model": "whisper-1"}}),
    "over the upload limit": (413, "file", lambda: {"files": {"file": ("big.wav", b"\0" * (UPLOAD_MB + 1) * 2**20)}}),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_are_4xx_in_openai_shape(url, case, spool):
    status, param, request = BAD_REQUESTS[case]
    r = httpx.post(url + "/v1/audio/transcriptions", timeout=60, **request())
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert str(spool) not in error["message"] and "/tmp" not in error["message"] and "Traceback" not in error["message"]
    assert healthy(url)["admitted"] == 0
    assert list(spool.iterdir()) == []


def test_audio_over_the_length_limit(url, tmp_path):
    path = tmp_path / "long.wav"
    joined_clips([JFK] * 6, path)  # 70 s, over the server's 1 minute
    r = httpx.post(url + "/v1/audio/transcriptions", files={"file": path.open("rb")}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "audio_too_long"


def test_unknown_route_and_method_in_openai_shape(url):
    assert httpx.get(url + "/v1/nothing").json()["error"]["message"]
    r = httpx.get(url + "/v1/audio/transcriptions")
    assert r.status_code == 405 and "error" in r.json()


def test_a_client_gone_mid_upload_leaves_nothing(url, spool):
    boundary = "b0undary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            "Content-Type: audio/wav\r\n\r\n").encode()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                  f"boundary={boundary}\r\nContent-Length: {3 * 2**20}\r\n\r\n".encode() + head + b"\0" * 2**20)
        deadline = time.monotonic() + 60
        while not list(spool.iterdir()) and time.monotonic() < deadline:  # the server has begun spooling the file
            time.sleep(0.01)
        assert list(spool.iterdir())
    assert settled(url)["admitted"] == 0
    assert list(spool.iterdir()) == []


@pytest.mark.slow
def test_a_client_gone_mid_stream_cancels_its_decode(url, long_file):
    before = healthy(url)["cancelled"]
    with httpx.stream("POST", url + "/v1/audio/transcriptions", timeout=120,
                      files={"file": long_file.open("rb"), "stream": (None, "true")}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                assert json.loads(line[5:])["type"] == "transcript.text.delta"
                break  # leaves after the first delta: the second window's decode is cancelled
    assert settled(url)["cancelled"] == before + 1


@pytest.mark.slow
def test_a_client_gone_mid_decode_cancels_it(url, long_file):
    """A plain (not streamed) request: the client closes its connection once its decode runs."""
    boundary = "b0undary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"long.wav\"\r\n\r\n").encode()
    body += long_file.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    before = healthy(url)["cancelled"]
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                  f"boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 60
        while not healthy(url)["running"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert healthy(url)["running"] == 1
    assert settled(url)["cancelled"] == before + 1


@pytest.mark.slow
def test_16_requests_from_8_clients_get_the_sequential_texts(client, models):
    short = [ENGLISH[i] for i in (1, 2, 4, 5)]  # 1.8 to 3.3 s each
    expected = {p: models["tiny.en"].transcribe(str(p), word_timestamps=False).text for p in short}
    clips = [short[i % len(short)] for i in range(16)]

    def ask(path):
        return client.audio.transcriptions.create(model="whisper-1", file=path.open("rb"), response_format="text",
                                                  extra_body=NO_WORDS)

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(ask, clips))
    assert texts == [expected[p] for p in clips]


@pytest.mark.slow
def test_a_prompt_that_makes_the_model_repeat_itself_is_answered_with_the_transcript(client, models, monkeypatch):
    """The issue's degenerate prompt: after it tiny.en's decodings of JFK loop ("word word ...", "yeah yeah ..."),
    and openai's fallback decoded each loop to the window's 224 tokens, five samples a temperature above 0, then
    did the same for the fraction of a second after the last word, which held the request's worker for half a
    minute or ended it in a 400 decode_time_exceeded. Every decoding stops where its text starts to loop (far
    short of the limit), a tail without voice is not decoded, and the request is answered with JFK's words for
    at most three times the work (encoder passes, decoder calls) of the same request without the prompt: the
    issue's bar is three times the time, and the work is what a CPU's speed does not move."""
    from whisperane.longform import step

    work, per_decoding = [], []
    model = models["tiny.en"]
    decoder_step, decode_window, encode = model.decoder.step, step.decode, model.encode
    monkeypatch.setattr(model.decoder, "step", lambda *a, **k: work.append("step") or decoder_step(*a, **k))
    monkeypatch.setattr(model, "encode", lambda *a, **k: work.append("encode") or encode(*a, **k))

    def counted(*args, **kwargs):
        before = work.count("step")
        result = decode_window(*args, **kwargs)
        per_decoding.append(work.count("step") - before)
        return result

    monkeypatch.setattr(step, "decode", counted)  # the server decodes in this process, on its worker threads
    client.audio.transcriptions.create(model="tiny.en", file=JFK.open("rb"))
    plain_work = list(work)
    work.clear()
    per_decoding.clear()
    raw = client.audio.transcriptions.with_raw_response.create(model="tiny.en", file=JFK.open("rb"),
                                                                prompt="word " * 224)
    assert raw.status_code == 200
    assert "ask not what your country can do for you" in raw.parse().text.lower()
    assert per_decoding and max(per_decoding) < 224 // 2
    assert work.count("encode") == plain_work.count("encode")
    print(f"decoder steps with the prompt {work.count('step')}, without {plain_work.count('step')}")
    assert work.count("step") <= 3 * plain_work.count("step")


def test_full_queue_is_503_with_retry_after_and_the_key_is_required(models, schedule, long_file):
    with serving(models, schedule, workers=1, queue=0, api_key="s3cret") as url:
        assert httpx.get(url + "/health").status_code == 200  # open without the key
        for path in ("/v1/models", "/v1/audio/transcriptions"):
            r = httpx.post(url + path) if "audio" in path else httpx.get(url + path)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        live = url.replace("http", "ws") + "/v1/audio/live"
        with pytest.raises(InvalidStatus):
            connect(live)
        with connect(live, subprotocols=["whisperane", "bearer.s3cret"]) as ws:  # how the page sends the key
            ws.send(json.dumps({"type": "end"}))
            assert [json.loads(m)["type"] for m in ws] == ["done"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        busy = client.audio.transcriptions.with_streaming_response.create(model="whisper-1", file=long_file.open("rb"),
                                                                         stream=True)
        with busy:  # headers received: its decode holds the only worker
            r = httpx.post(url + "/v1/audio/transcriptions", headers={"Authorization": "Bearer s3cret"},
                           files={"file": JFK.open("rb")})
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
            assert r.json()["error"]["code"] == "server_busy"
        assert settled(url)["admitted"] == 0  # the stream left: its decode was cancelled
        assert client.audio.transcriptions.create(model="whisper-1", file=JFK.open("rb")).text.strip()


def test_serve_binds_loopback_by_default():
    from whisperane.command import build_parser

    args = build_parser(["serve"]).parse_args(["serve"])
    assert args.host == "127.0.0.1" and args.max_upload_mb == 25 and args.api_key is None


def test_serve_encodes_on_the_workers_cores_and_refuses_bad_thread_counts(capsys):
    from whisperane.command import build_parser, main
    from whisperane.server.command import encoder_threads

    parse = lambda *a: build_parser(["serve"]).parse_args(["serve", *a])  # noqa: E731
    assert encoder_threads(parse("--max-concurrency", "3", "--threads-per-worker", "2")) == 6
    assert encoder_threads(parse("--encoder-threads", "1")) == 1
    for flag in ("--encoder-threads", "--threads-per-worker", "--max-concurrency"):
        assert main(["serve", flag, "0"]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "must be >= 1" in err and "Traceback" not in err


def _pcm_chunks(path, seconds: float = 0.5) -> list[bytes]:
    """The clip as 16 kHz s16le PCM in frames of ``seconds``."""
    pcm = (np.clip(load_audio(str(path)), -1, 32767 / 32768) * 32768).astype("<i2").tobytes()
    step = int(16000 * seconds) * 2
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


def test_websocket_streams_the_live_engines_confirmed_text(url, models):
    from websockets.sync.client import connect

    frames = _pcm_chunks(ENGLISH[3], seconds=2.0)  # "For a full hour he had paced up and down ...", 5.4 s
    samples = [np.frombuffer(f, "<i2").astype(np.float32) / 32768 for f in frames]
    reference = [e for e in whisperane.stream(samples, model=models["tiny.en"]) if e.type == "done"][0]
    with connect(url.replace("http", "ws") + "/v1/audio/live?model=tiny.en") as ws:
        for frame in frames:
            ws.send(frame)
        ws.send(json.dumps({"type": "end"}))
        events = [json.loads(m) for m in ws]
    assert events[-1]["type"] == "done" and {e["type"] for e in events} <= {"hypothesis", "confirmed", "done"}
    confirmed = "".join(e["text"] for e in events if e["type"] == "confirmed")
    assert confirmed == events[-1]["text"] == events[-1]["result"]["text"]
    assert _words(events[-1]["text"]) == _words(reference.text)


def test_websocket_events_equal_the_engines_for_the_same_feeds(url, models):
    """The clip in one frame: one feed() then finish() on the server, so its events are the engine's, exactly."""
    from websockets.sync.client import connect

    pcm = b"".join(_pcm_chunks(ENGLISH[1]))  # "Stuff it into you, his belly counselled him", 3.3 s
    engine = whisperane.LiveTranscriber(models["tiny.en"])
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    expected = [(e.type, e.text) for e in engine.feed(samples) + engine.finish()]
    with connect(url.replace("http", "ws") + "/v1/audio/live") as ws:
        ws.send(pcm)
        ws.send(json.dumps({"type": "end"}))
        assert [(e["type"], e["text"]) for e in map(json.loads, ws)] == expected


def test_websocket_takes_the_engines_prompt_options(url, models):
    """prompt (the initial prompt), carry_initial_prompt and hotwords reach the live engine: its events are the
    engine's with the same options; a bad flag closes the session (1008) with its error."""
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    pcm = b"".join(_pcm_chunks(ENGLISH[1]))
    options = {"initial_prompt": "Glossary: belly, counselled.", "carry_initial_prompt": True, "hotwords": "Stuff"}
    engine = whisperane.LiveTranscriber(models["tiny.en"], **options)
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    expected = [(e.type, e.text) for e in engine.feed(samples) + engine.finish()]
    query = "prompt=Glossary%3A%20belly%2C%20counselled.&carry_initial_prompt=true&hotwords=Stuff"
    with connect(url.replace("http", "ws") + "/v1/audio/live?" + query) as ws:
        ws.send(pcm)
        ws.send(json.dumps({"type": "end"}))
        assert [(e["type"], e["text"]) for e in map(json.loads, ws)] == expected
    messages = []
    with connect(url.replace("http", "ws") + "/v1/audio/live?carry_initial_prompt=maybe") as ws:
        with pytest.raises(ConnectionClosedError) as closed:
            for message in ws:
                messages.append(json.loads(message))
    assert closed.value.rcvd.code == 1008 and "carry_initial_prompt" in closed.value.rcvd.reason
    assert messages[-1]["error"]["param"] == "carry_initial_prompt"


def _words(text: str) -> list[str]:
    return [w.strip(".,!?").lower() for w in text.split()]


def test_a_chunked_upload_over_the_limit_is_413_once_past_it(url, spool):
    """No Content-Length to refuse from: the body is counted as it arrives."""
    boundary = "b0undary"

    def body():
        yield (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n").encode()
        for _ in range(UPLOAD_MB * 4 + 4):  # 256 KB pieces: 1 MB past the limit
            yield b"\0" * 2**18
        yield f"\r\n--{boundary}--\r\n".encode()

    r = httpx.post(url + "/v1/audio/transcriptions", content=body(), timeout=60,
                   headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"
    assert settled(url)["admitted"] == 0 and list(spool.iterdir()) == []
