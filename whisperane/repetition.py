"""Where a decoding loops: the same text tokens over and over (``the the the``, a sentence again and again). openai's
fallback finds a loop only after the whole window's 224 tokens, then decodes the window again at each higher
temperature; a caller that cannot wait that long (a live update) cuts the loop where it starts instead."""

from __future__ import annotations

from collections.abc import Sequence

from .tokenizer import Tokenizer

# A loop is two copies of a stretch of text tokens, with at least this many tokens repeated: "no, no, no" is speech,
# sixteen of them in a row is the decoder stuck.
MIN_REPEATED_TOKENS = 16
# The longest repeated stretch looked for (a sentence of text tokens).
MAX_PERIOD = 48


def loop_start(tokens: Sequence[int], timestamp_begin: int) -> int | None:
    """The index into ``tokens`` (sampled tokens, timestamps among them) where the text starts to repeat itself:
    the first token of the second copy of the repeated stretch (the first copy is kept: it is what the audio most
    likely says). None where the text does not end in a loop. Timestamps are skipped: a looping decoder repeats
    the text while its timestamps move on."""
    positions = [i for i, t in enumerate(tokens) if t < timestamp_begin]
    text = [tokens[i] for i in positions]
    n = len(text)
    for period in range(1, min(MAX_PERIOD, n // 2) + 1):
        span = period + max(period, MIN_REPEATED_TOKENS)
        if n < span or text[n - span + period :] != text[n - span : n - period]:
            continue
        start = n - span
        while start > 0 and text[start - 1] == text[start - 1 + period]:
            start -= 1
        return positions[start + period]
    return None


def cut_loop(tokens: list[int], logprobs: list[float], sample_begin: int, tokenizer: Tokenizer) -> bool:
    """Where one row's sampled tokens (``tokens[sample_begin:]``, with their ``logprobs``) end in a loop, drop the
    loop from both lists, end the row (<|endoftext|>) and say so."""
    start = loop_start(tokens[sample_begin:], tokenizer.timestamp_begin)
    if start is None:
        return False
    del tokens[sample_begin + start :]
    del logprobs[start:]
    tokens.append(tokenizer.eot)
    return True
