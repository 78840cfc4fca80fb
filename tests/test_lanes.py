"""Where batched mode splits the speech into lanes (``lanes.lane_regions``, ``lanes.pause_lengths``).

A lane starts without the previous text and the lane before it stops at its cut, so cuts go to the longest
pauses that keep every lane within LANE_SPREAD of an equal share of the speech. Measured on the 609 s benchmark
file (base, batch 8): cutting at equal shares put one cut in a 0.5 s pause between two lines of a sonnet, the
lane before it wrote the line twice, WER 4.96 %; cut at pauses, 3.94 % (sequential 3.74 %).
"""

from __future__ import annotations

import numpy as np

from whisperane.audio import N_SAMPLES, SAMPLE_RATE, open_audio
from whisperane.longform.lanes import Tail, lane_regions, pack_tails, pause_lengths
from whisperane.vad.regions import WINDOW_SAMPLES, SpeechRegion
from whisperane.vad.stream import SpeechStream

REGION_S = 20  # seconds of speech per region


def _speech(pauses: list[int]) -> tuple[list[SpeechRegion], np.ndarray]:
    """Touching regions of REGION_S seconds (as the VAD's 30 s limit leaves them); between regions k and k + 1,
    ``pauses[k]`` quiet windows centred on their common edge (0: a cut inside speech)."""
    windows = REGION_S * SAMPLE_RATE // WINDOW_SAMPLES
    probabilities = np.full(windows * (len(pauses) + 1), 0.9, dtype=np.float32)
    for k, pause in enumerate(pauses):
        edge = (k + 1) * windows
        probabilities[edge - pause // 2 : edge - pause // 2 + pause] = 0.05
    size = windows * WINDOW_SAMPLES
    regions = [SpeechRegion(k * size, (k + 1) * size) for k in range(len(pauses) + 1)]
    return regions, probabilities


def _starts(lanes: list[list[SpeechRegion]], regions: list[SpeechRegion]) -> list[int]:
    return [regions.index(lane[0]) for lane in lanes]


def test_pause_lengths_count_the_quiet_windows_around_each_edge():
    regions, probabilities = _speech([4, 0, 30, 1])
    assert pause_lengths(regions, probabilities, threshold=0.5) == [4, 0, 30, 1]


def test_pause_lengths_include_a_gap_between_regions():
    regions, probabilities = _speech([10])
    gap = 20 * WINDOW_SAMPLES
    apart = [regions[0], SpeechRegion(regions[1].start + gap, regions[1].end + gap)]
    probabilities = np.concatenate([probabilities[: len(probabilities) // 2], np.full(20, 0.05, np.float32),
                                    probabilities[len(probabilities) // 2 :]])
    assert pause_lengths(apart, probabilities, threshold=0.5) == [30]


def test_lanes_are_cut_at_the_longest_pause_near_an_equal_share():
    """8 regions in 2 lanes: the equal share ends after region 3; the long pause after region 4 (lanes of 100
    and 60 s, within LANE_SPREAD of 80 s) takes the cut, and shorter pauses nearer do not."""
    pauses = [3, 3, 3, 5, 40, 3, 3]
    regions, probabilities = _speech(pauses)
    lanes = lane_regions(regions, 2, pause_lengths(regions, probabilities, threshold=0.5))
    assert _starts(lanes, regions) == [0, 5]
    assert _starts(lane_regions(regions, 2), regions) == [0, 4]  # without pauses: the equal share


def test_a_long_pause_too_far_from_the_share_does_not_take_the_cut():
    """Lanes stay within LANE_SPREAD of their 160 s share: the long pause after the first region (lanes of 20
    and 300 s) does not take the cut, the longest pause that keeps them within it (lanes of 140 and 180 s) does."""
    pauses = [40, 3, 3, 3, 3, 3, 6, 3, 3, 3, 3, 3, 3, 3, 3]
    regions, probabilities = _speech(pauses)
    lanes = lane_regions(regions, 2, pause_lengths(regions, probabilities, threshold=0.5))
    assert _starts(lanes, regions) == [0, 7]


def test_pauses_count_up_to_a_good_pause_then_even_lanes_win():
    """Pauses of 0.8 s or more are all as good a cut: of two splits at such pauses the evener is taken (3 lanes
    of 240 s: cuts at 30-window pauses give 80/80/80 s, at 60-window pauses 60/80/100 s)."""
    pauses = [3, 3, 60, 30, 3, 3, 60, 30, 3, 3, 3]
    regions, probabilities = _speech(pauses)
    lanes = lane_regions(regions, 3, pause_lengths(regions, probabilities, threshold=0.5))
    assert _starts(lanes, regions) == [0, 4, 8]


def test_equal_shares_where_no_split_keeps_the_lanes_even():
    """One region of 100 s among short ones: no split into 2 lanes keeps both within LANE_SPREAD of 80 s, so
    the equal-share split is taken."""
    regions, probabilities = _speech([3] * 3)
    regions = [SpeechRegion(0, 100 * SAMPLE_RATE), *regions[1:]]
    lanes = lane_regions(regions, 2, [3, 40, 3])
    assert _starts(lanes, regions) == [0, 1]


def test_lanes_keep_every_region_once_and_in_order():
    rng = np.random.default_rng(3)
    pauses = [int(p) for p in rng.integers(0, 60, 40)]
    regions, probabilities = _speech(pauses)
    for count in (1, 2, 3, 8):
        lanes = lane_regions(regions, count, pause_lengths(regions, probabilities, threshold=0.5))
        assert [r for lane in lanes for r in lane] == regions
        assert len(lanes) == min(count, int(len(regions) * REGION_S // 60))


def _tail(start_s: float, *seconds: float) -> Tail:
    """A lane's tail of regions of ``seconds`` each from ``start_s`` on, 1 s apart (no lane: not read here)."""
    regions, t = [], start_s
    for length in seconds:
        regions.append(SpeechRegion(int(t * SAMPLE_RATE), int((t + length) * SAMPLE_RATE)))
        t += length + 1
    return Tail(None, regions)


def test_tails_are_packed_into_fewer_windows_each_in_audio_order():
    """The 609 s benchmark file's eight lanes (tiny.en) left tails of 27.2, 4.2, 27.3, 12.1, 8.5, 27.3, 10.7 and
    5.9 s: packed first-fit decreasing, five windows instead of eight."""
    tails = [_tail(100 * k, *split) for k, split in enumerate(
        [(27.2,), (4.2,), (20.0, 7.3), (12.1,), (8.5,), (27.3,), (5.0, 5.7), (5.9,)])]
    bins = pack_tails(tails)
    assert len(bins) == 5
    assert sorted(id(t) for b in bins for t in b) == sorted(id(t) for t in tails)  # every tail once
    for b in bins:
        assert sum(t.n_samples for t in b) <= N_SAMPLES
        starts = [t.regions[0].start for t in b]
        assert starts == sorted(starts)
        regions = [r for t in b for r in t.regions]
        assert all(x.end <= y.start for x, y in zip(regions, regions[1:], strict=False))  # a SpeechStream's regions


def test_a_tail_is_what_is_left_of_its_lanes_regions():
    regions = [SpeechRegion(16000, 48000), SpeechRegion(64000, 96000), SpeechRegion(128000, 160000)]
    stream = SpeechStream(open_audio(np.zeros(160000, np.float32)), regions, 160000)
    assert stream.regions_from(0) == regions
    assert stream.regions_from(40000) == [SpeechRegion(72000, 96000), SpeechRegion(128000, 160000)]
    assert stream.regions_from(64000) == [regions[2]]
    assert stream.regions_from(96000) == []

