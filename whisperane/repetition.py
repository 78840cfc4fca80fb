"""Where a decoding loops: the same text tokens over and over (``the the the``, a sentence again and again). openai's
fallback finds a loop only after the whole window's 224 tokens (their compression ratio is too high), then decodes
the window again at each higher temperature. A decoding with ``DecodingOptions.stop_at_repetition`` stops in the
loop instead, the loop cut (``DecodingResult.looped``). A file's decoding stops once the text has failed openai's
check already (``DecodingOptions.loop_ratio``), and its fallback counts it as too repetitive and goes on to the next
temperature: openai's decision without the rest of the loop. A live update stops at the loop's first repeat and
keeps the text before it (the next update decodes its audio again)."""

from __future__ import annotations

import zlib
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
        # the last token against the one a period before first: most periods fail there, without a slice
        if n < span or text[n - 1] != text[n - 1 - period] or text[n - span + period :] != text[n - span : n - period]:
            continue
        start = n - span
        while start > 0 and text[start - 1] == text[start - 1 + period]:
            start -= 1
        return positions[start + period]
    return None


def compression_ratio(text: str) -> float:
    """openai's measure of a decoding's repetition: the text's length over its zlib-compressed length."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def cut_loop(tokens: list[int], logprobs: list[float], sample_begin: int, tokenizer: Tokenizer,
             min_ratio: float | None = None) -> bool:
    """Where one row's sampled tokens (``tokens[sample_begin:]``, with their ``logprobs``) end in a loop, drop the
    loop from both lists, end the row (<|endoftext|>) and say so. With ``min_ratio`` (openai's compression-ratio
    threshold), only once their text's compression ratio is over it too: a loop that goes on only adds to it, so
    openai's check of the whole decoding would fail it; a loop the model leaves before (speech that repeats a
    sentence) is decoded on and judged whole, as openai's."""
    start = loop_start(tokens[sample_begin:], tokenizer.timestamp_begin)
    if start is None:
        return False
    if min_ratio is not None and compression_ratio(tokenizer.decode(tokens[sample_begin:]).strip()) <= min_ratio:
        return False
    del tokens[sample_begin + start :]
    del logprobs[start:]
    tokens.append(tokenizer.eot)
    return True
