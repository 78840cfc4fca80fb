"""Word times after the alignment (``words.add_words``, openai's placement): the rules of whisperane's own that
move a window's words, applied to typed segments (``result.Segment``, never changed in place), each in one of
two stages either side of the window's verdict (``step.WindowStep``):

- ``heard_words``, before it: where the VAD hears the words. A segment DTW put at one instant (openai's loop
  clears it) takes the voice beside it (``speech_guard.instants_onto_voice``, every mode with the speech guard).
  These are the times openai's seek rule, the hallucination skip and the guard's verdict read: where the words
  are decides where the next window starts and what is kept. The verdict itself moves the words of a segment it
  checks against the voice onto it (``speech_guard.onto_voice``).
- ``place_words``, after it: the reported times of the kept segments. Word edges out of digital silence
  (``words.trim_words_to_sound``), then, where words are checked against voice (the guard's default mode), the
  edges of words at a pause onto the voice (``speech_guard.edges_onto_voice``). These refine what is reported
  only: the next window's alignment starts from the kept words' end before them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..result import Segment
from .speech_guard import SpeechGuard
from .window import Window
from .words import trim_words_to_sound


def heard_words(w: Window, decoded: Sequence[Segment], guard: SpeechGuard | None) -> list[Segment]:
    """Window ``w``'s decoded segments (with their words) as the VAD hears them; as decoded without a guard."""
    return guard.heard_words(w, decoded) if guard else list(decoded)


def place_words(w: Window, kept: Sequence[Segment], guard: SpeechGuard | None) -> list[Segment]:
    """The final word times of window ``w``'s ``kept`` segments (the verdict's, with words)."""
    placed = trim_words_to_sound(kept, w.samples, w.time_offset)
    return guard.edges_onto_voice(w, placed) if guard else placed
