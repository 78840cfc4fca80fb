"""Batched mode, a layer over the sequential loop (``seek.SeekLoop``, through its public methods): the speech
found by Silero VAD in ``batch_size`` lanes transcribed side by side.

The speech regions (at most 30 s each) are split into ``batch_size`` lanes of consecutive regions with about
equal speech. Each lane is the sequential loop over its speech alone (as ``vad_filter``): 30 s windows from
the seek, its own previous text as the prompt, the speech guard, openai's rules. The lanes advance together: per
step, the next window of every lane goes through the encoder (a call each, into one reused batch:
``WhisperaneModel.encode_rows`` says why) and through the decoder in one call per token (each row at its own cache position, with its own prompt, cross K/V,
timestamp rules and stopping: ``decoding.decode_windows``); a window whose greedy result fails openai's
checks is decoded again alone at the following temperatures, and the rest of its loop (words, seek) is the
sequential one. Lane boundaries are the only places where a window starts without the previous text.

A lane's last window would cost a whole encoder call however little speech it holds, so (with word timestamps)
a lane stops before it: its tail waits for a free row, in a bin with the other lanes' tails of that round
(``pack_tails``), decoded as one more loop over their speech with the previous text of the first; a segment of
a bin across two tails is split where the later one starts (``split_at``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..audio import HOP_LENGTH, N_SAMPLES, SAMPLE_RATE, AudioStream
from ..decoding import decode_windows
from ..language import LanguageChoice
from ..options import TranscribeOptions
from ..result import Segment, TranscriptionResult, result_from_segments
from ..runtime.model import WhisperaneModel
from ..tokenizer import Tokenizer
from ..vad.regions import VOICED, WINDOW_SAMPLES, SpeechRegion, speech_regions
from ..vad.silero import default_vad
from ..vad.stream import SpeechStream
from .seek import SeekLoop, WindowDone, empty_result
from .vad_filter import vad_options
from .window import Window
from .words import restore_timestamps

# A lane starts without previous text, which costs accuracy: lanes of at least two windows of speech keep that to
# a few windows of a long file.
MIN_LANE_SECONDS = 60.0


def lane_regions(regions: Sequence[SpeechRegion], count: int,
                 pauses: Sequence[int] | None = None) -> list[list[SpeechRegion]]:
    """At most ``count`` runs of consecutive regions, each of MIN_LANE_SECONDS or more where the speech allows.
    ``pauses[k]``: the silence (VAD windows) between regions k and k + 1 (``pause_lengths``); with them the runs
    end at the longest pauses their lengths allow (``_cuts_at_pauses``), else at equal shares of the speech."""
    before = np.cumsum([0, *(r.n_samples for r in regions)])  # before[k]: the speech ahead of region k
    total = int(before[-1]) or 1
    count = max(1, min(count, int(total / SAMPLE_RATE // MIN_LANE_SECONDS)))
    starts = _cuts_at_pauses(before, count, pauses) if pauses is not None and count > 1 else None
    if starts is None:  # equal shares: a run begins with the first region at or past its share
        firsts = (int(np.searchsorted(before[:-1], j * total / count)) for j in range(count))
        starts = sorted({k for k in firsts if k < len(regions)})
    return [list(regions[a:b]) for a, b in zip(starts, [*starts[1:], len(regions)], strict=True)]


# A lane starts without the previous text and the lane before it stops at the cut: cut where the speaker
# pauses. A pause of GOOD_PAUSE (0.8 s) is as good a cut as a longer one; each lane's speech stays within
# LANE_SPREAD of an equal share, since the longest lane sets batched mode's wall time and regions of up to 30 s
# leave little choice within a tighter spread.
GOOD_PAUSE = 25
LANE_SPREAD = (0.5, 1.3)


def _cuts_at_pauses(before: np.ndarray, count: int, pauses: Sequence[int]) -> list[int] | None:
    """The first region of each of ``count`` runs (``before``: cumulative speech ahead of each region and in all)
    maximising the sum of min(pause, GOOD_PAUSE) at the cuts, then the evenness (the longest run shortest), with
    every run's speech within LANE_SPREAD of an equal share; None when no split keeps to that. Dynamic
    programming over (runs so far, first region of the next run)."""
    n = len(before) - 1
    low, high = (f * before[-1] / count for f in LANE_SPREAD)
    best: list[dict[int, tuple[int, float, int]]] = [{0: (0, 0.0, -1)}]  # best[j][k]: (score, -longest, previous)
    for j in range(1, count + 1):
        row: dict[int, tuple[int, float, int]] = {}
        for k in range(j, n) if j < count else (n,):  # where run j ends (the last run: at the end)
            gain = min(pauses[k - 1], GOOD_PAUSE) if j < count else 0
            first = int(np.searchsorted(before, before[k] - high, side="left"))
            last = int(np.searchsorted(before, before[k] - low, side="right"))
            options = []
            for p in range(first, min(last, k)):  # the runs ending at k whose speech is within the spread
                if p in best[-1]:
                    score, longest, _ = best[-1][p]
                    options.append((score + gain, min(longest, float(before[p] - before[k])), p))
            if options:
                row[k] = max(options)
        best.append(row)
    if n not in best[-1]:
        return None
    starts, k = [], n
    for j in range(count, 0, -1):
        k = best[j][k][2]
        starts.append(k)
    return starts[::-1]


def pause_lengths(regions: Sequence[SpeechRegion], probabilities: np.ndarray, threshold: float) -> list[int]:
    """The silence between each two neighbouring regions, in VAD windows below ``threshold`` around the point
    between them: regions of at most 30 s split long speech at short pauses (often inside a sentence, and
    their padding makes them touch), which is the worst place for a lane to start without the previous text
    and for the lane before it to end (a line cut there can come out twice)."""
    loud = np.flatnonzero(np.asarray(probabilities) >= threshold)
    lengths = []
    for left, right in zip(regions[:-1], regions[1:], strict=True):
        i = (left.end + right.start) // 2 // WINDOW_SAMPLES
        after = np.searchsorted(loud, i)  # the first loud window at or after i
        if after < len(loud) and loud[after] == i:
            lengths.append(0)
            continue
        first_loud_after = loud[after] if after < len(loud) else len(probabilities)
        last_loud_before = loud[after - 1] if after > 0 else -1
        lengths.append(int(first_loud_after - last_loud_before - 1))
    return lengths


def batched_windows(model: WhisperaneModel, open_stream: Callable[[], AudioStream],
                    options: TranscribeOptions) -> Generator[WindowDone, None, TranscriptionResult]:
    """Batched mode over a source opened once for the VAD, then once per lane (and per bin of tails) for its
    speech: each round of windows decoded side by side (no segments: a lane's are final only once every lane is
    done), then every segment at once; returns the result."""
    with open_stream() as stream:
        probabilities, n_samples = default_vad().speech_probabilities(stream)
    vad = vad_options(options, batched=True)
    regions = speech_regions(probabilities, n_samples, vad)
    duration = n_samples / SAMPLE_RATE
    if not regions:
        return empty_result(model, options, duration)
    voiced_regions = speech_regions(probabilities, n_samples, VOICED)  # for every loop's speech guard, found once
    language = LanguageChoice(model, options.language, options.task)  # the first lane's first window's, for all

    def open_bin(tails: list[Tail]) -> SeekLoop:
        speech = SpeechStream(open_stream(), [r for tail in tails for r in tail.regions], n_samples, probabilities)
        # the text before its first tail is its prompt
        return SeekLoop.over_speech(model, speech, options, voiced_regions, language, tails[0].lane.prompt.current)

    rounds = _Rounds(model, options, open_bin, language)
    lanes: list[SeekLoop] = []
    try:
        for run in lane_regions(regions, options.batch_size, pause_lengths(regions, probabilities, vad.threshold)):
            speech = SpeechStream(open_stream(), run, n_samples, probabilities)
            lanes.append(SeekLoop.over_speech(model, speech, options, voiced_regions, language))
        # Tails are packed only where words say where to split a segment across two of them (split_at).
        for done in rounds.run(lanes, defer_tails=options.word_timestamps and len(lanes) > 1):
            yield WindowDone((), done * duration, duration)
    finally:
        for loop in [*lanes, *(b for b, _ in rounds.bins)]:
            loop.stream.close()
    segments, voiced = [], probabilities >= vad.threshold
    for lane in lanes:
        segments.extend(restore_timestamps(lane.segments, lane.stream.time_map, voiced))
    for b, tails in rounds.bins:
        restored = restore_timestamps(b.segments, b.stream.time_map, voiced)
        segments.extend(split_at(restored, [tail.regions[0].start_s for tail in tails[1:]], b.tokenizer))
    segments.sort(key=lambda s: s.start)  # stable: lanes are in audio order, bins hold what lanes left
    tokenizer, language_probs = language.of(None)
    result = result_from_segments(segments, tokenizer, duration, language_probs, options.word_timestamps)
    yield WindowDone(result.segments, duration, duration)
    return result


@dataclass(frozen=True)
class Tail:
    """What is left of a lane when its next window would be its last and not full: the original audio's
    regions from its seek on, decoded later in a bin with other lanes' tails."""

    lane: SeekLoop
    regions: list[SpeechRegion]

    @property
    def n_samples(self) -> int:
        return sum(r.n_samples for r in self.regions)


def pack_tails(tails: Sequence[Tail]) -> list[list[Tail]]:
    """Tails packed first-fit decreasing into bins of at most one window of speech, each bin's tails in audio
    order. A lane's last window costs a whole encoder call however little it holds: bins share those calls."""
    bins: list[list[Tail]] = []
    for tail in sorted(tails, key=lambda t: -t.n_samples):
        fit = next((b for b in bins if sum(t.n_samples for t in b) + tail.n_samples <= N_SAMPLES), None)
        if fit is None:
            bins.append([tail])
        else:
            fit.append(tail)
    return [sorted(b, key=lambda t: t.regions[0].start) for b in bins]


def split_at(segments: list[Segment], junctions: Sequence[float], tokenizer: Tokenizer) -> list[Segment]:
    """A bin's segments (original times, with words) split where a later lane's tail starts (``junctions``,
    seconds): the two sides lie apart in the audio, other lanes' segments between them. The text and tokens
    of each part are its words'."""
    out = []
    for segment in segments:
        words = segment.words or ()
        starts = [w.start for w in words]
        cuts = sorted({bisect.bisect_left(starts, j) for j in junctions} - {0, len(words)})
        if not cuts:
            out.append(segment)
            continue
        for a, b in zip([0, *cuts], [*cuts, len(words)], strict=True):
            part = words[a:b]
            text = "".join(w.word for w in part)
            out.append(replace(segment, words=part, text=text, tokens=tuple(tokenizer.encode(text)),
                               start=part[0].start, end=part[-1].end))
    return out


class _Rounds:
    """The rounds of one batched call: lanes side by side, and bins of their tails (``Tail``) in the rows
    the lanes leave; the language and decoding options (from the first window) and the batch of encoder rows
    are shared by all."""

    def __init__(self, model: WhisperaneModel, options: TranscribeOptions, open_bin: Callable[[list[Tail]], SeekLoop],
                 language: LanguageChoice):
        self.model, self.options, self.open_bin, self.language = model, options, open_bin, language
        self.decoding = self.rows = None
        self.lanes: list[SeekLoop] = []
        self.bins: list[tuple[SeekLoop, list[Tail]]] = []  # each bin's loop and the tails it holds

    def run(self, lanes: list[SeekLoop], defer_tails: bool) -> Iterator[float]:
        """Step every loop that has a window left: their windows encoded, decoded greedily in one call per
        token, then each finished by its own loop (fallback, words, seek); after each round, the share of the
        speech decoded. With ``defer_tails``, a lane whose next window would be its last and not full stops there;
        its tail goes to a bin (``_launch``)."""
        self.lanes = lanes
        active, waiting = list(lanes), []
        while True:
            if defer_tails and (ending := [loop for loop in active if loop in lanes and loop.ends_in_a_tail()]):
                waiting += [Tail(loop, loop.stream.regions_from(loop.position.seek * HOP_LENGTH)) for loop in ending]
                active = [loop for loop in active if loop not in ending]
            batch = [(loop, w) for loop in active if (w := loop.next_window()) is not None]
            for loop in self._launch(waiting, self.options.batch_size - len(batch)):
                active.append(loop)
                if (w := loop.next_window()) is not None:
                    batch.append((loop, w))
            if not batch:
                return
            self._decode(batch)
            yield self._done()

    def _launch(self, waiting: list[Tail], free: int) -> list[SeekLoop]:
        """Bins of the waiting tails (taken from ``waiting``) for the ``free`` rows of this round, fullest
        first: tails that end in one round share windows; a tail never waits for a later one (a round of its
        own costs more than the window it would share)."""
        launched = []
        for pieces in pack_tails(waiting)[: max(0, free)]:
            loop = self.open_bin(pieces)
            self.bins.append((loop, pieces))
            launched.append(loop)
            for tail in pieces:
                waiting.remove(tail)
        return launched

    def _done(self) -> float:
        """The share of the speech decoded (a lane's tail counts in its bin)."""
        loops = [*self.lanes, *(loop for loop, _ in self.bins)]
        done = sum(min(loop.position.seek, loop.position.content_frames) for loop in loops)
        return done / max(1, sum(loop.position.content_frames for loop in self.lanes))

    def _decode(self, batch: list[tuple[SeekLoop, Window]]) -> None:
        model, options = self.model, self.options
        self.rows = model.encode_rows([w.mel for _, w in batch], self.rows)  # one batch of arrays for every step
        enc = self.rows.first_rows(len(batch))
        tokenizer, _ = self.language.of(enc.row(0))  # the first round: from the first lane's first window
        if self.decoding is None:
            self.decoding = options.decoding(options.temperature[0], tokenizer.language, None, seed=0)
        results = decode_windows(model, enc, self.decoding, tokenizer, [loop.prompt.current for loop, _ in batch])
        for i, (loop, w) in enumerate(batch):
            loop.advance(replace(w, enc=enc.row(i), mel=None), results[i])

