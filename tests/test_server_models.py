"""The server's models loaded on their first request (``--lazy-load``) and unloaded once idle (``--model-ttl``,
speaches' WHISPER__TTL): the registry's rules with a stand-in loader (no model is unloaded while it is held, a
request during an unload loads it again), then a real server over tiny.en."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from served import serving  # noqa: E402

import whisperane.server.models as server_models  # noqa: E402
from whisperane.command import main as cli_main  # noqa: E402
from whisperane.errors import WhisperaneError  # noqa: E402
from whisperane.server.models import ModelRegistry  # noqa: E402

JFK = Path(__file__).parent / "data" / "jfk.flac"


class StandIn:
    """What the registry loads in the rule tests: an object with an identity."""


def _registry(bundle: Path, ttl: float, lazy: bool = True) -> tuple[ModelRegistry, list]:
    loads: list[StandIn] = []

    def load(source):
        loads.append(StandIn())
        return loads[-1]

    return ModelRegistry([str(bundle)], load, ttl=ttl, lazy=lazy), loads


def _idle(registry: ModelRegistry) -> None:
    """Until the registry's pending unloads have run (a guard against a hang, not a timing)."""
    deadline = time.monotonic() + 30
    while registry.timers and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_lazy_model_loads_on_first_use_once(tiny_en_bundle):
    registry, loads = _registry(tiny_en_bundle, ttl=-1)
    assert loads == [] and not registry.loaded("tiny.en")
    assert registry.languages("whisper-1") == (False, ["en"])  # from the bundle, unloaded
    first, second = registry.acquire("whisper-1"), registry.acquire("tiny.en")
    assert first.model is second.model is loads[0] and len(loads) == 1 and registry.loaded("tiny.en")
    first.release(), second.release(), second.release()
    _idle(registry)
    assert registry.loaded("tiny.en")  # -1: never unloaded


def test_ttl_zero_unloads_once_nothing_holds_the_model(tiny_en_bundle):
    registry, loads = _registry(tiny_en_bundle, ttl=0, lazy=False)
    assert len(loads) == 1  # loaded at start
    a, b = registry.acquire("tiny.en"), registry.acquire("tiny.en")
    a.release()
    _idle(registry)
    assert registry.loaded("tiny.en")  # b still holds it
    b.release()
    _idle(registry)
    assert not registry.loaded("tiny.en")
    assert registry.acquire("tiny.en").model is loads[1]  # the next request loads it again


def test_a_request_during_an_unload_waits_for_it_then_loads_again(tiny_en_bundle, monkeypatch):
    registry, loads = _registry(tiny_en_bundle, ttl=0)
    unloading, finish = threading.Event(), threading.Event()

    def slow_release():
        unloading.set()
        assert finish.wait(30)

    monkeypatch.setattr(server_models, "release_freed_memory", slow_release)
    registry.acquire("tiny.en").release()
    assert unloading.wait(30)  # the unload is under way
    got = []
    request = threading.Thread(target=lambda: got.append(registry.acquire("tiny.en")))
    request.start()
    request.join(0.2)
    assert got == []  # it waits for the unload...
    finish.set()
    request.join(30)
    assert got and got[0].model is loads[-1] and len(loads) == 2  # ...then loads the model again


def test_bad_ttls_and_names_fail_at_start(tiny_en_bundle, capsys):
    with pytest.raises(WhisperaneError, match="model-ttl"):
        ModelRegistry([str(tiny_en_bundle)], lambda source: StandIn(), ttl=-2)
    for argv in (["--model", "tiny-en", "--lazy-load"], ["--model", str(tiny_en_bundle), "--model-ttl", "-3"]):
        assert cli_main(["serve", "--port", "1", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err


# --- a real server -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_lazy_server_loads_on_the_first_request_and_unloads_after_its_ttl(tiny_en_bundle):
    """/v1/models says whether the model is loaded; the first request loads it, the TTL (0.5 s) unloads it and its
    memory goes with it; a request after that (or arriving while it unloads) loads it again; a live stream holds it
    (never unloaded under the stream); an unknown model is a 404 in OpenAI's shape."""
    from websockets.sync.client import connect

    from whisperane.server.scheduling import Schedule

    schedule = Schedule(threads=1, encoder_threads=2)
    loaded = []  # weak references to every model loaded

    def load(source):
        model = schedule.load_model(source)
        loaded.append(weakref.ref(model))
        return model

    registry = ModelRegistry([str(tiny_en_bundle)], load, ttl=0.5, lazy=True)
    with serving(registry, schedule, workers=2, queue=4) as url:
        assert _cards(url) == {"tiny.en": False}
        texts = [_transcribe(url) for _ in range(2)]
        assert texts[0] == texts[1] and "ask not what your country" in texts[0]
        _wait(lambda: _cards(url) == {"tiny.en": False})
        gc.collect()
        assert len(loaded) >= 1 and all(model() is None for model in loaded)  # nothing kept an unloaded model
        with connect(url.replace("http", "ws") + "/v1/audio/live?model=tiny.en") as ws:
            ws.send(b"\0\0" * 16000)
            time.sleep(1.0)  # past the TTL: the stream holds the model
            assert _cards(url) == {"tiny.en": True}
            ws.send(json.dumps({"type": "end"}))
            assert json.loads(list(ws)[-1])["type"] == "done"
        with ThreadPoolExecutor(max_workers=3) as pool:  # requests as it unloads and loads again
            assert set(pool.map(lambda _: _transcribe(url), range(3))) == {texts[0]}
        r = httpx.post(url + "/v1/audio/transcriptions", files={"file": JFK.open("rb")}, data={"model": "tiny"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert httpx.get(url + "/v1/models/tiny").status_code == 404


def _cards(url: str) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in httpx.get(url + "/v1/models").json()["data"]}


def _transcribe(url: str) -> str:
    r = httpx.post(url + "/v1/audio/transcriptions", files={"file": JFK.open("rb")},
                   data={"model": "tiny.en", "word_timestamps": "false"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["text"]


def _wait(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the guard's time"
        time.sleep(0.05)
