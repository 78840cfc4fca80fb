"""The live engine: an audio buffer decoded again on each update, LocalAgreement-2 over the decodings, the
buffer trimmed behind confirmed sentences and closed at pauses (Silero VAD), events on the stream's timeline.

All state belongs to one ``LiveTranscriber``: one loaded model serves several streams at once (threads).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from ..audio import SAMPLE_RATE
from ..errors import OptionsError
from ..language import choose_language
from ..options import TranscribeOptions, check_options_for_model
from ..result import TranscriptionResult, Word
from ..runtime.decoder_adapters import CrossAttention
from ..runtime.model import WhisperaneModel
from ..tokenizer import Tokenizer
from .agreement import agreed_prefix, unconfirmed_part
from .buffer import decode_buffer, encode_buffer
from .events import StreamEvent, ends_sentence, result_of, words_text

# Word times from the cross-attention gathered while decoding, not a second (teacher-forced) decoder pass: the
# same text for less CPU an update; a stream may still ask for it.
STREAM_ALIGNMENT = "decode"
# Characters of confirmed text before the buffer that prompt each decoding (whisper_streaming's 200).
PROMPT_CHARS = 200
# Audio kept before the voice when silence is dropped from the buffer: the VAD hears an onset late.
LEAD_IN_S = 0.5
# A multilingual model's language is detected again on each update until the stream has held this much voice.
LANGUAGE_VOICE_S = 3.0
# Voice this long before the last update's end is decoded once more (with the audio after it), then no longer.
RECHECK_S = 0.5
# A pause this long, with every word before it confirmed, empties the buffer (but for LEAD_IN_S): the next words are
# decoded after the prompt alone, as a file's next window is. Where the old sentence stays in the buffer, before a
# silence, the decoder often ends the text with it and leaves the new words undecoded for several updates, or for
# good.
LONG_PAUSE_S = 1.0
# Where no update fell inside the pause (a slow update, a long min_chunk), the new voice is found after a pause this
# long: longer than an orator's pause inside a sentence (JFK's: 1.06-1.09 s), where a cut would lose the audio's
# context, which the pause seen from inside rarely meets (an update within its last tenth of a second).
PAUSE_BEFORE_NEW_VOICE_S = 1.25
# Voice this long after the last confirmed word is more than its trailing sound (the VAD's voice outlasts a word's
# decoded end by up to a quarter second): words no decoding wrote, decoded once more on their own.
UNCOVERED_S = 0.5
# A decoded word that starts this long after the pause began is noise the decoder put into the silence.
PAUSE_TOLERANCE_S = 0.3


@dataclass(frozen=True)
class LiveOptions:
    """How a stream updates (beside the TranscribeOptions of each decoding)."""

    min_chunk: float = 0.5  # seconds of new audio that start an update
    pause: float = 0.5  # seconds of silence (VAD) that close an utterance: its tail is confirmed there
    trim_after: float = 10.0  # once the buffer is longer, it is cut at the end of a confirmed sentence or segment
    max_buffer: float = 20.0  # once longer, cut at the last confirmed word (the window is 30 s)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise OptionsError(f"{f.name} must be a number > 0, not {value!r}")
        if not self.trim_after <= self.max_buffer <= 28.0:
            raise OptionsError("trim_after <= max_buffer <= 28 s must hold (a decoding sees at most 30 s)")


def split_options(options: dict) -> tuple[LiveOptions, TranscribeOptions]:
    """Keyword options -> (LiveOptions, TranscribeOptions); an unknown name is a TypeError."""
    live_names = {f.name for f in fields(LiveOptions)}
    known = live_names | {f.name for f in fields(TranscribeOptions)}
    unknown = set(options) - known
    if unknown:
        raise TypeError(f"unknown stream option(s): {', '.join(sorted(unknown))}")
    live = LiveOptions(**{k: v for k, v in options.items() if k in live_names})
    decoding = TranscribeOptions(**{"alignment": STREAM_ALIGNMENT, **{k: v for k, v in options.items() if k not in live_names}})
    if decoding.batch_size is not None or decoding.vad_filter or decoding.clip_timestamps != (0.0,) or decoding.multilingual:
        raise OptionsError("a stream decodes its own buffer: batch_size, vad_filter, clip_timestamps and "
                           "multilingual do not apply")
    if decoding.diarize:
        raise OptionsError("diarize labels a finished transcript; a live stream cannot serve it (use whisperane transcribe)")
    if not decoding.word_timestamps:
        raise OptionsError("a stream confirms words by their times: word_timestamps must stay on")
    return live, decoding


class LiveTranscriber:
    """One live stream: ``feed()`` audio as it arrives, ``finish()`` at its end (see whisperane/live/__init__)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, model: WhisperaneModel, clock: Callable[[], float] | None = None, **options):
        self.live, self.options = split_options(options)
        check_options_for_model(self.options, model.is_multilingual)
        self.model = model
        self.options = replace(self.options, initial_prompt=None, speech_guard=False)
        self._initial_prompt = (options.get("initial_prompt") or "").strip()
        self._tokenizer = model.tokenizer(self.options.language, self.options.task) if self.options.language or not model.is_multilingual else None
        start = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - start)
        from .voice import VoiceTrack  # here, not above: `import whisperane` does not load the VAD module

        self._voice = VoiceTrack()
        self._buffer = np.zeros(0, dtype=np.float32)
        self._buffer_start = 0  # the buffer's first sample on the stream's timeline
        self._received = 0
        self._decoded_until = 0  # samples the last update saw
        self._confirmed: list[Word] = []
        self._hypothesis: list[Word] = []  # the last decoding's words past the confirmed text
        self._segment_ends: set[float] = set()  # end times of confirmed words that ended a decoded segment
        self._done = False
        self._redecoded_after = -1.0  # the confirmed end after which uncovered voice was decoded alone once

    @property
    def audio_time(self) -> float:
        return self._received / SAMPLE_RATE

    @property
    def confirmed_words(self) -> tuple[Word, ...]:
        return tuple(self._confirmed)

    def feed(self, samples: np.ndarray) -> list[StreamEvent]:
        """Append float32 mono 16 kHz samples; run one update when min_chunk of new audio has arrived."""
        if self._done:
            raise OptionsError("the stream has finished: feed() after finish()")
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._buffer = np.concatenate([self._buffer, samples])
        self._received += len(samples)
        self._voice.push(samples)
        if self._received - self._decoded_until < self.live.min_chunk * SAMPLE_RATE:
            return []
        return self._update()

    def finish(self) -> list[StreamEvent]:
        """End of input: a last update over what is left, its whole hypothesis confirmed, then "done"."""
        events = self._update() if self._received > self._decoded_until and not self._done else []
        events += self._confirm(len(self._hypothesis))
        return events + self.stop()

    def stop(self) -> list[StreamEvent]:
        """Stop at once (an interrupted stream): "done" with what was confirmed, nothing decoded again."""
        if self._done:
            return []
        self._done = True
        events = [self._event("hypothesis", [])] if self._hypothesis else []
        self._hypothesis = []
        return events + [self._event("done", self._confirmed, self.result())]

    def result(self) -> TranscriptionResult:
        """The confirmed words as ``transcribe()``'s result."""
        tokenizer = self._tokenizer or choose_language(self.model, None, self.options.language, self.options.task)[0]
        return result_of(self._confirmed, tokenizer, self.audio_time)

    # --- one update -----------------------------------------------------------------------------------

    def _update(self) -> list[StreamEvent]:
        last_update, self._decoded_until = self._decoded_until, self._received
        previous = list(self._hypothesis)
        events: list[StreamEvent] = []
        if self._has_voice(last_update):
            enc = encode_buffer(self.model, self._buffer)
            tokenizer, settled = self._language(enc)
            voiced = self._voice.voiced_frames(self._buffer_start)
            decoding = decode_buffer(self.model, self._buffer, enc, self.options, tokenizer, self._prompt(), voiced)
            if decoding.decoded:  # else the hypothesis stays: the next update decodes the audio again, with more
                offset = self._buffer_start / SAMPLE_RATE
                words = [Word(w.word, round(w.start + offset, 2), round(w.end + offset, 2), w.probability)
                         for w in decoding.words]
                ends = {words[i].end for i in decoding.segment_ends}
                current = unconfirmed_part(words, self._confirmed)
                self._hypothesis = current
                if not settled:  # nothing is confirmed in a language that may still change
                    return [self._event("hypothesis", current)] if current != previous else []
                events += self._confirm(agreed_prefix(previous, current), ends)
        events += self._close_at_pause()
        events += self._trim()
        if self._hypothesis != previous or events:
            events.append(self._event("hypothesis", self._hypothesis))
        return events

    def _has_voice(self, last_update: int) -> bool:
        """Whether there is something to decode: a hypothesis, or voice past the confirmed text that arrived
        since the last update (or in the RECHECK_S before it: the decoding may have needed more audio after
        it), or voice before the pause that no decoding wrote (decoded once on its own). After a long pause the
        buffer keeps only a lead-in: the next utterance is decoded after the prompt, not after the silence."""
        since = max(self._buffer_start, last_update - round(RECHECK_S * SAMPLE_RATE))
        if self._confirmed:
            since = max(since, round(self._confirmed[-1].end * SAMPLE_RATE))
        if self._hypothesis:
            return True
        if self._voice.has_voice(since):
            self._cut_before_new_voice()
            return True
        if self._uncovered_voice():
            self._redecoded_after = self._confirmed[-1].end
            self._cut(round(self._confirmed[-1].end * SAMPLE_RATE))
            return True
        if self._voice.pause_seconds() >= LONG_PAUSE_S:
            self._cut(self._received - round(LEAD_IN_S * SAMPLE_RATE))
        return False

    def _uncovered_voice(self) -> bool:
        """Voice after the confirmed words (their trailing sound aside) and before the pause that no decoding
        wrote (a decoding that stopped early, then the pause closed the utterance), not yet decoded on its own."""
        pause_start = self._voice.pause_start()
        if not self._confirmed or pause_start is None or self._confirmed[-1].end == self._redecoded_after:
            return False
        after = round((self._confirmed[-1].end + UNCOVERED_S) * SAMPLE_RATE)
        return after < pause_start and self._voice.has_voice(max(after, self._buffer_start), pause_start)

    def _cut_before_new_voice(self) -> None:
        """The long pause's cut where the pause fell between two updates (a slow update, a long min_chunk): the
        first voice after the confirmed words (their trailing sound aside) follows PAUSE_BEFORE_NEW_VOICE_S of silence."""
        if self._confirmed:
            after = round((self._confirmed[-1].end + PAUSE_TOLERANCE_S) * SAMPLE_RATE)
            pause = round(PAUSE_BEFORE_NEW_VOICE_S * SAMPLE_RATE)
            onset = self._voice.onset_after_pause(max(after, self._buffer_start), pause)
            if onset is not None:
                self._cut(onset - round(LEAD_IN_S * SAMPLE_RATE))

    def _confirm(self, n: int, segment_ends: set[float] | None = None) -> list[StreamEvent]:
        if n == 0:
            return []
        new, self._hypothesis = self._hypothesis[:n], self._hypothesis[n:]
        self._confirmed.extend(new)
        self._segment_ends.update(w.end for w in new if segment_ends and w.end in segment_ends)
        return [self._event("confirmed", new)]

    def _close_at_pause(self) -> list[StreamEvent]:
        """At a pause of ``live.pause`` after the voice, the utterance's hypothesis is confirmed (its words up
        to the pause; later ones are the decoder's inventions in the silence) without waiting for agreement."""
        pause_start = self._voice.pause_start()
        if not self._hypothesis or pause_start is None or self._voice.pause_seconds() < self.live.pause:
            return []
        limit = pause_start / SAMPLE_RATE + PAUSE_TOLERANCE_S
        keep = 0
        while keep < len(self._hypothesis) and self._hypothesis[keep].start < limit:
            keep += 1
        self._hypothesis = self._hypothesis[:keep]
        return self._confirm(keep)

    def _trim(self) -> list[StreamEvent]:
        """Keep the buffer short: cut at the end of the last confirmed sentence or segment once it is longer
        than trim_after, at the last confirmed word once longer than max_buffer; where no word in it was
        confirmed by then, the hypothesis in its first part is (it has been decoded again and again), or,
        without one, only its last trim_after seconds are kept (voice that gives no words)."""
        length = (self._received - self._buffer_start) / SAMPLE_RATE
        if length <= self.live.trim_after:
            return []
        inside = [w for w in self._confirmed if w.end * SAMPLE_RATE > self._buffer_start]
        cuts = [w.end for w in inside if ends_sentence(w) or w.end in self._segment_ends]
        if not cuts and length > self.live.max_buffer and inside:
            cuts = [inside[-1].end]
        if cuts:
            self._cut(round(cuts[-1] * SAMPLE_RATE))
            return []
        if length <= self.live.max_buffer:
            return []
        keep_from = self._received / SAMPLE_RATE - self.live.trim_after
        n = sum(1 for w in self._hypothesis if w.end <= keep_from)
        events = self._confirm(n)
        self._cut(round((self._confirmed[-1].end if n else keep_from) * SAMPLE_RATE))
        return events

    def _cut(self, sample: int) -> None:
        """Drop the buffer's audio before ``sample`` (on the stream's timeline)."""
        sample = min(max(sample, self._buffer_start), self._received)
        self._buffer = self._buffer[sample - self._buffer_start :].copy()
        self._buffer_start = sample

    # --- context ----------------------------------------------------------------------------------------

    def _prompt(self) -> str:
        """The confirmed text before the buffer (after the initial prompt), its last PROMPT_CHARS characters; with
        carry_initial_prompt, the initial prompt and the confirmed text's last characters that fit with it."""
        if not self.options.condition_on_previous_text:
            return self._initial_prompt
        start = self._buffer_start / SAMPLE_RATE
        before = words_text([w for w in self._confirmed if w.end <= start]).strip()
        if self.options.carry_initial_prompt and self._initial_prompt:
            room = PROMPT_CHARS - len(self._initial_prompt) - 1
            return (self._initial_prompt + " " + (before[-room:].lstrip() if room > 0 else "")).strip()
        text = (self._initial_prompt + " " + before).strip()
        return text[-PROMPT_CHARS:].lstrip()

    def _language(self, enc: CrossAttention) -> tuple[Tokenizer, bool]:
        """The stream's tokenizer, and whether its language is settled. A multilingual model without a
        language detects it on the buffer at each update until LANGUAGE_VOICE_S of voice was heard, or the
        voice paused: then it keeps it."""
        if self._tokenizer is not None:
            return self._tokenizer, True
        tokenizer, _ = choose_language(self.model, enc, None, self.options.task)
        if self._voice.voiced_seconds() >= LANGUAGE_VOICE_S or self._voice.pause_seconds() >= self.live.pause:
            self._tokenizer = tokenizer
        return tokenizer, self._tokenizer is not None

    def _event(self, kind: str, words, result: TranscriptionResult | None = None) -> StreamEvent:
        text = words_text(words)
        return StreamEvent(kind, text, tuple(words), self.audio_time, self._clock(), result)
