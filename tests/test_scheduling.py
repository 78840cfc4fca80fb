"""Who arranges a model's components: the model runs them as loaded (no lock, no count of its users); the idle
weights' release is a load-time wrap (``runtime.sessions``); the server's schedule (``server.scheduling``) owns
the one-encoder-at-a-time turn and the choice of a lone request's wide decoder, and its decode pool counts the
requests."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import whisperane
from whisperane.runtime.sessions import Around, IdleWeights, keep_resident
from whisperane.server.scheduling import EncoderTurn, Schedule, WhenAlone


class Recorded:
    """A component that says which of them ran, and logs its runs and releases."""

    def __init__(self, name, log=None):
        self.name, self.inputs, self.outputs, self.released = name, {}, {}, 0
        self.log = log if log is not None else []

    def run(self, feeds, outputs=None):
        self.log.append(f"run {self.name}")
        return {"by": self.name}

    def run_into(self, feeds, outputs):
        self.log.append(f"run_into {self.name}")

    def release_weights(self):
        self.released += 1
        self.log.append(f"release {self.name}")


class Overlaps(Around):
    """An encoder whose calls take a while, counting how many ran at once."""

    def __init__(self, inner):
        super().__init__(inner)
        self.now = self.most = 0
        self._lock = threading.Lock()

    def run(self, feeds, outputs=None):
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.05)
        try:
            return self.inner.run(feeds, outputs)
        finally:
            with self._lock:
                self.now -= 1


def test_idle_weights_release_the_decoders_for_each_encoder_call_and_the_encoder_after_it():
    log = []
    idle = IdleWeights()
    decoder = idle("decoder", Recorded("decoder", log), None)
    sequence = idle("sequence", Recorded("sequence", log), None)
    mel = idle("mel", Recorded("mel", log), None)
    encoder = idle("encoder", Recorded("encoder", log), None)
    assert (decoder.name, sequence.name, mel.name) == ("decoder", "sequence", "mel")  # not wrapped
    encoder.run({})
    encoder.run_into({}, {})
    assert log == ["release decoder", "release sequence", "run encoder", "release encoder",
                   "release decoder", "release sequence", "run_into encoder", "release encoder"]
    assert keep_resident("encoder", mel, None) is mel


def test_a_component_opened_twice_runs_wide_only_for_a_request_alone():
    schedule = Schedule(threads=1, encoder_threads=2)
    component = WhenAlone(Recorded("narrow"), Recorded("wide"), schedule.alone)
    released = lambda: (component.narrow.released, component.wide.released)  # noqa: E731
    assert released() == (0, 1)  # opened out of the resident set
    with schedule.request():
        assert component.run({})["by"] == "wide" and released() == (1, 1)  # the one left releases its weights
        assert component.run({})["by"] == "wide" and released() == (1, 1)
        with schedule.request():
            assert schedule.running == 2
            assert component.run({})["by"] == "narrow" and released() == (1, 2)
        assert component.run({})["by"] == "wide" and released() == (2, 2)
    component.release_weights()
    assert released() == (3, 3)


def test_the_choice_of_session_is_made_under_a_lock():
    """Threads switching the sessions at once: each change of the choice, in the order the choices were made,
    releases the session left exactly once (unlocked, two threads could both release one or miss one)."""
    choices = [False]  # opened on the narrow session
    pattern = iter(i % 3 == 0 for i in range(100_000))

    def alone():
        choices.append(next(pattern))
        return choices[-1]

    component = WhenAlone(Recorded("narrow"), Recorded("wide"), alone)
    with ThreadPoolExecutor(4) as pool:
        ran = list(pool.map(lambda _: component.run({})["by"], range(2000)))
    assert set(ran) == {"narrow", "wide"}
    changes = sum(a != b for a, b in zip(choices, choices[1:], strict=False))
    assert component.narrow.released + component.wide.released - 1 == changes  # the wide one: once when opened


def test_the_encoder_turn_lets_one_call_in_at_a_time():
    inner = Overlaps(Recorded("encoder"))
    turn = threading.Lock()
    first, second = EncoderTurn(inner, turn), EncoderTurn(inner, turn)  # two models' encoders, one turn
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: (first if i % 2 else second).run({}), range(8)))
    assert inner.most == 1


def _encoders_at_once(model, mel) -> None:
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: model.encode(mel), range(4)))


def test_the_model_serializes_nothing_and_the_schedule_one_encoder_call_at_a_time(tiny_en_bundle):
    """The command line's model runs two threads' encoder calls side by side (it holds no lock); the server's
    schedule runs them one at a time."""
    seen = {}

    def recording(role, component, reopen):
        if role == "encoder":
            seen[len(seen)] = component = Overlaps(component)
        return component

    plain = whisperane.load_model(tiny_en_bundle, threads=1, wrap=lambda r, c, o: IdleWeights()(r, recording(r, c, o), o))
    schedule = Schedule(threads=1, encoder_threads=1)
    wrap = schedule.wrapper()
    served = whisperane.load_model(tiny_en_bundle, threads=1, wrap=lambda r, c, o: wrap(r, recording(r, c, o), o))
    mel = plain.log_mel(np.zeros(16000, dtype=np.float32))
    _encoders_at_once(plain, mel)
    _encoders_at_once(served, mel)
    assert (seen[0].most, seen[1].most) == (2, 1)


def test_the_decode_pool_counts_its_jobs_in_the_schedule():
    from whisperane.server.workers import DecodePool, Job

    schedule = Schedule()
    pool = DecodePool(2, 0, schedule)
    try:
        assert pool.submit(Job(), lambda job: schedule.running).result(timeout=10) == 1
        assert pool.running == schedule.running == 0
    finally:
        pool.shutdown()


@pytest.mark.parametrize("encoder_threads, wide", [(1, False), (2, True)])
def test_the_schedule_opens_a_wide_decoder_only_where_the_encoder_has_more_threads(tiny_en_bundle, encoder_threads,
                                                                                   wide, monkeypatch):
    """What the schedule's load hands the model for each role (its wrap's result, recorded)."""
    schedule = Schedule(threads=1, encoder_threads=encoder_threads)
    wrapper, components = schedule.wrapper, {}

    def recording():
        wrap = wrapper()

        def record(role, component, reopen):
            components[role] = wrap(role, component, reopen)
            return components[role]

        return record

    monkeypatch.setattr(schedule, "wrapper", recording)
    schedule.load_model(tiny_en_bundle)
    assert isinstance(components["decoder"], WhenAlone) == wide
    assert isinstance(components["encoder"], EncoderTurn)
