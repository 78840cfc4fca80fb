"""LocalAgreement-2 over word hypotheses (whisper_streaming's policy): a word is confirmed once two
consecutive decodings of the buffer agree on it and on every word before it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..result import Word
from ..timing import PUNCTUATION

# A re-decoded word that starts this long before the end of the last confirmed word is one already confirmed.
CONFIRMED_OVERLAP_S = 0.1
# The longest run of words that a new decoding may repeat from the end of the confirmed text.
MAX_REPEATED_WORDS = 5
# A word that starts inside the confirmed text but ends this long after it holds new audio: the first word after a
# prompt may be aligned back over the audio the prompt already covers.
STRADDLE_S = 0.2


def same_word(a: Word, b: Word) -> bool:
    """The same word in two decodings: its punctuation and capitals may change with the audio after it (a
    buffer that ends on "you" decodes "you." once the pause is heard); the later decoding's form is kept."""
    return _key(a.word) == _key(b.word)


def _key(word: str) -> str:
    return word.strip().strip(PUNCTUATION).lower()


def agreed_prefix(previous: Sequence[Word], current: Sequence[Word]) -> int:
    """How many leading words two consecutive hypotheses share."""
    n = 0
    for a, b in zip(previous, current, strict=False):
        if not same_word(a, b):
            break
        n += 1
    return n


def unconfirmed_part(words: Sequence[Word], confirmed: Sequence[Word]) -> list[Word]:
    """The words of a decoding that lie past the confirmed text: those starting before its end are dropped
    (but for one ending well past it, which then starts there), then a run of up to MAX_REPEATED_WORDS at the
    start that repeats the confirmed text's last words (a word whose timing moved a little across decodings)."""
    if not confirmed:
        return list(words)
    end = confirmed[-1].end
    new = []
    for w in words:
        if w.start > end - CONFIRMED_OVERLAP_S:
            new.append(w)
        elif w.end > end + STRADDLE_S:
            new.append(replace(w, start=end))
    if new and abs(new[0].start - end) < 1.0:
        for n in range(min(len(confirmed), len(new), MAX_REPEATED_WORDS), 0, -1):
            if all(same_word(a, b) for a, b in zip(confirmed[-n:], new[:n], strict=True)):
                return new[n:]
    return new
