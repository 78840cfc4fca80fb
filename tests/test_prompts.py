"""The window prompt's two vocabulary options: ``carry_initial_prompt`` (openai-whisper 20250625's rule, held to
openai-whisper itself on the same float32 weights) and ``hotwords`` (faster-whisper's get_prompt), and that
neither puts words into audio without speech."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import DATA_DIR
from longform import DATA_ENGLISH_CLIPS, LongAudio, build_long_audio, english_clips
from openai_reference import (
    DEFAULT_TEMPERATURES,
    kept_of_result,
    load_openai_model,
    openai_transcribe,
    stored_result,
)

from whisperane.audio import FRAMES_PER_SECOND, SAMPLE_RATE, load_audio
from whisperane.decoding import plan_window
from whisperane.errors import OptionsError
from whisperane.options import DecodingOptions, TranscribeOptions
from whisperane.prompts import window_prompt

N_TEXT_CTX = 448  # every Whisper's; the prompt keeps n_text_ctx // 2 - 1 = 223 tokens
LONG_FILE = (0, 60, 80, None)  # tests/longform.build_long_audio: seed, min and max seconds, silent gaps
# Names and terms of the corpus's and tests/data's English clips (66 tokens): for hotwords and the silence tests.
VOCABULARY = ("Quilter, Gutenberg, Netherlands, woodcutters, typography, Exhibition, mutton, turnips, counselled, "
              "antecedents, Americans, comparatively, surpassed, predecessors, movable metal letters, fifteenth "
              "century, block books, the art of printing, fellow citizens, his belly, peppered flour.")
# A carried prompt (119 tokens) long enough that the previous text beside it (104 tokens at most) is cut from the
# long file's third window on.
CARRIED_PROMPT = ("A reading of nineteenth century prose and verse, and a speech. Speakers: Mr. Quilter, President "
                  "Kennedy, Stephen Dedalus. Terms: Gutenberg, typography, woodcutters of the Netherlands, block books, "
                  "movable metal letters, the Exhibition, antecedents, predecessors, comparatively modern, never "
                  "surpassed, counselled, mutton, turnips, peppered flour, bruised potatoes, the apostle of the middle "
                  "classes, his gospel, fellow Americans, ask not what your country can do, a full hour, paced up and "
                  "down, he could wait no longer.")


def openai_prompt(all_tokens, prompt_reset_since, initial_prompt_tokens, carry_initial_prompt):
    """openai-whisper 20250625's transcribe(), lines 238-293, as written there (the reference)."""
    remaining_prompt_length = N_TEXT_CTX // 2 - 1 - len(initial_prompt_tokens)
    if carry_initial_prompt:
        nignored = max(len(initial_prompt_tokens), prompt_reset_since)
        remaining_prompt = all_tokens[nignored:][-remaining_prompt_length:]
        return initial_prompt_tokens + remaining_prompt
    return all_tokens[prompt_reset_since:]


@pytest.mark.parametrize("n_initial", [0, 5, 150, 223, 230])
@pytest.mark.parametrize("carry", [False, True])
def test_the_window_prompt_is_openais(n_initial, carry):
    """Every text length and reset point, the initial prompt short, long, as long as the budget and longer (where
    openai's slice keeps the whole text, or drops its start)."""
    initial = list(range(1000, 1000 + n_initial))
    for n_text in (0, 1, 100, 222, 223, 400):
        tokens = initial + list(range(n_text))
        for reset in sorted({0, n_initial, n_initial + n_text // 2, len(tokens)}):
            expected = openai_prompt(tokens, reset, initial, carry)
            assert window_prompt(tokens, reset, initial, carry, N_TEXT_CTX) == expected


def test_a_carried_prompt_starts_with_the_initial_prompt_and_fits():
    initial = [7] * 20
    prompt = window_prompt(initial + list(range(500)), 20, initial, True, N_TEXT_CTX)
    assert prompt[:20] == initial and prompt[20:] == list(range(500))[-203:] and len(prompt) == 223
    assert window_prompt(initial + list(range(500)), 520, initial, True, N_TEXT_CTX) == initial  # after a reset


def _head(model, **options) -> list[int]:
    tokenizer = model.tokenizer("en", "transcribe")
    plan = plan_window(model, DecodingOptions(language="en", **options), tokenizer)
    return plan.initial[: plan.sot_index]


def test_hotwords_go_before_the_previous_text(tiny_float32_model):
    """faster-whisper's get_prompt: <|startofprev|>, the hotwords, the previous text's last 223 tokens; hotwords
    alone where there is no previous text; none where a prefix is given. Long hotwords cut the previous text so that
    the head keeps at most 336 of the 448 positions."""
    tokenizer = tiny_float32_model.tokenizer("en", "transcribe")
    hot = tokenizer.encode(" Quilter Gutenberg")
    previous = list(range(300, 800))
    head = _head(tiny_float32_model, hotwords="Quilter Gutenberg", prompt=previous)
    assert head == [tokenizer.sot_prev, *hot, *previous[-223:]]
    assert _head(tiny_float32_model, hotwords="Quilter Gutenberg") == [tokenizer.sot_prev, *hot]
    assert _head(tiny_float32_model, hotwords="Quilter Gutenberg", prefix="And") == []
    assert _head(tiny_float32_model, prompt=previous) == [tokenizer.sot_prev, *previous[-223:]]
    long = _head(tiny_float32_model, hotwords=" word" * 400, prompt=previous)  # hotwords cut to 223 tokens...
    assert long[1:224] == tokenizer.encode(" word" * 400)[:223] and long[224:] == previous[-112:]  # ...336 in all


def test_hotwords_and_a_prefix_are_refused():
    """A prefix starts every window here (openai's), so hotwords (faster-whisper drops them under a prefix) could
    never apply."""
    with pytest.raises(OptionsError, match="hotwords"):
        TranscribeOptions(hotwords="Quilter", prefix="And")
    with pytest.raises(OptionsError, match="carry_initial_prompt"):
        TranscribeOptions(carry_initial_prompt="yes")


# --- against openai-whisper -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whisperane_tiny_en(tiny_en_bundle):
    import whisperane

    return whisperane.load_model(tiny_en_bundle, compute_type="float32", threads=2)


def openai_carried(audio: LongAudio, ct2_dir: Path, condition_on_previous_text: bool, write: bool = False) -> dict:
    """openai-whisper's transcribe(carry_initial_prompt=True) of ``audio`` with the prompt each window was given
    (``prompts``: its DecodingOptions.prompt at the first temperature, before the decoder keeps its last 223
    tokens): stored, else run (``write``: store)."""
    clips = "data" if set(audio.clip_ids) <= {Path(name).stem for name in DATA_ENGLISH_CLIPS} else "corpus"
    name = f"carry-{'previous' if condition_on_previous_text else 'reset'}-{audio.name}-{clips}"
    options = dict(initial_prompt=CARRIED_PROMPT, carry_initial_prompt=True,
                   condition_on_previous_text=condition_on_previous_text)

    def compute() -> dict:
        model, prompts = load_openai_model(ct2_dir), []
        decode = model.decode

        def recording(mel, decode_options):  # transcribe() calls model.decode once per temperature
            if decode_options.temperature == DEFAULT_TEMPERATURES[0]:
                prompts.append([int(t) for t in decode_options.prompt or []])
            return decode(mel, decode_options)

        model.decode = recording
        return {**openai_transcribe(model, audio.samples, **options), "prompts": prompts}

    return stored_result(name, audio.samples, ct2_dir / "model.bin", compute, write,
                         keep=lambda result: {**kept_of_result(result), "prompts": result["prompts"]})


def _rows(segments) -> list[tuple[float, float, float, str]]:
    """openai's segments as (seek s, start, end, text), each from its first word's start to its last word's end,
    as whisperane reports a segment (test_longform.py says why)."""
    rows = []
    for s in segments:
        words = s.get("words") or []
        start, end = (words[0]["start"], words[-1]["end"]) if words else (s["start"], s["end"])
        rows.append((s["seek"] / FRAMES_PER_SECOND, round(float(start), 2), round(float(end), 2), s["text"]))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("condition_on_previous_text", [True, False], ids=["previous-text", "reset-each-window"])
def test_carried_prompt_windows_equal_openai_whispers(condition_on_previous_text, whisperane_tiny_en,
                                                      ct2_tiny_en_dir, monkeypatch):
    """The same prompts, windows, texts and times (0.01 s) as openai-whisper's transcribe(carry_initial_prompt=True) on the
    same tiny.en weights in float32, the speech guard off, over a 60-80 s file of clips (tests/longform.py): with
    the previous text (cut to fit beside the 119-token prompt from the third window on) and with a reset after every
    window (condition_on_previous_text off: the initial prompt alone each time). openai's results are stored
    (tests/data/openai), computed again where the audio or the weights differ."""
    import whisperane
    from whisperane.longform import step

    audio = build_long_audio(*LONG_FILE)
    options = dict(initial_prompt=CARRIED_PROMPT, carry_initial_prompt=True,
                   condition_on_previous_text=condition_on_previous_text)
    theirs = openai_carried(audio, ct2_tiny_en_dir, condition_on_previous_text)
    prompts: list[list[int]] = []
    decode_with_fallback = step.decode_with_fallback

    def recording(model, enc, options, prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return decode_with_fallback(model, enc, options, prompt, *args, **kwargs)

    monkeypatch.setattr(step, "decode_with_fallback", recording)
    ours = whisperane.transcribe(audio.samples, model=whisperane_tiny_en, speech_guard=False, word_timestamps=True,
                                 temperature=DEFAULT_TEMPERATURES, best_of=5, **options)
    assert prompts == theirs["prompts"]  # each window's prompt, before the decoder cuts it to its last 223 tokens
    ours_rows = [(s.seek / FRAMES_PER_SECOND, s.start, s.end, s.text) for s in ours.segments]
    theirs_rows = _rows(theirs["segments"])
    assert len({row[0] for row in ours_rows}) >= 3, "the file should take three windows or more"
    initial = whisperane_tiny_en.tokenizer("en", "transcribe").encode(" " + CARRIED_PROMPT)
    if condition_on_previous_text:  # the previous text was cut to fit beside the initial prompt at least once
        assert sum(len(s.tokens) for s in ours.segments[:-1]) > N_TEXT_CTX // 2 - 1 - len(initial)
    assert [(r[0], r[3]) for r in ours_rows] == [(r[0], r[3]) for r in theirs_rows]  # windows and texts
    times = np.array([r[1:3] for r in ours_rows]) - np.array([r[1:3] for r in theirs_rows])
    assert np.abs(times).max() < 0.01 + 1e-9, "a segment's start or end differs from openai's by 0.01 s or more"
    assert ours.text == theirs["text"]


@pytest.mark.slow
def test_every_lane_carries_the_initial_prompt(tiny_int8_model, monkeypatch):
    """Batched mode: each lane's windows (and the bins of their tails) are decoded together with each lane's own
    prompt (``SeekLoop.prompt``): with carry_initial_prompt every one starts with the initial prompt, and the
    lanes' later windows add their previous text after it."""
    import whisperane
    import whisperane.longform.lanes as lanes

    prompts: list[list[int]] = []
    decode_windows = lanes.decode_windows

    def recording(model, enc, options, tokenizer, rows):
        prompts.extend(list(p) for p in rows)
        return decode_windows(model, enc, options, tokenizer, rows)

    monkeypatch.setattr(lanes, "decode_windows", recording)
    audio = build_long_audio(1, 130, 160, None)
    whisperane.transcribe(audio.samples, model=tiny_int8_model, batch_size=4, initial_prompt=VOCABULARY,
                          carry_initial_prompt=True)
    initial = tiny_int8_model.tokenizer("en", "transcribe").encode(" " + VOCABULARY)
    assert len(prompts) >= 4 and all(p[: len(initial)] == initial for p in prompts)
    assert any(len(p) > len(initial) for p in prompts)


# --- no words into silence ---------------------------------------------------------------------------------------


def _quiet(seconds: float, rms: float | None, seed: int = 64) -> np.ndarray:
    n = round(seconds * SAMPLE_RATE)
    if rms is None:
        return np.zeros(n, np.float32)
    return (np.random.default_rng(seed).standard_normal(n) * rms).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("options", [dict(hotwords=VOCABULARY),
                                     dict(initial_prompt=VOCABULARY, carry_initial_prompt=True)],
                         ids=["hotwords", "carried-prompt"])
def test_vocabulary_puts_no_words_into_silence(options, tiny_int8_model):
    """With the speech guard on (its rules apply to any text, whatever the prompt), a prompt naming words to expect
    gives no words in 45 s of digital silence framed by low noise (-50 dBFS, the framed-clip benchmark's) nor in
    40 s of the noise alone, and none outside the speech of a clip framed by 15 s of silence and 15 s of noise."""
    import whisperane

    framed = np.concatenate([_quiet(15.0, 0.003), _quiet(45.0, None), _quiet(15.0, 0.003, seed=65)])
    for audio in (framed, _quiet(40.0, 0.003, seed=66)):
        result = whisperane.transcribe(audio, model=tiny_int8_model, **options)
        assert [w.word for s in result.segments for w in s.words] == []
    speech = load_audio(DATA_DIR / "jfk.flac")
    audio = np.concatenate([_quiet(15.0, None), speech, _quiet(15.0, 0.003)])
    words = [w for s in whisperane.transcribe(audio, model=tiny_int8_model, **options).segments for w in s.words]
    end = 15.0 + len(speech) / SAMPLE_RATE
    assert len(words) >= 10 and all(w.end > 15.0 - 0.5 and w.start < end + 0.5 for w in words)


if __name__ == "__main__":
    # Store openai-whisper's results, with the corpus's clips and with tests/data's:
    #   .venv/bin/python tests/test_prompts.py [CORPUS_DIR]   (from the repository root; default ../shared/corpus)
    import sys

    from conftest import CORPUS_DIR

    from whisperane.convert.sources import resolve_source

    ct2_dir = resolve_source("tiny.en", progress=False).path
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else CORPUS_DIR
    for clips in (english_clips(corpus), english_clips(Path("/nonexistent"))):
        for condition in (True, False):
            openai_carried(build_long_audio(*LONG_FILE, clips=clips), ct2_dir, condition, write=True)
