"""A window's prompt: the previous text a seek loop gives it (``window_prompt``: openai-whisper's rule, with and
without ``carry_initial_prompt``), and what the decoder puts before the sot sequence (``prompt_head``: that text
after faster-whisper's hotwords)."""

from __future__ import annotations

from collections.abc import Sequence


def window_prompt(text: Sequence[int], reset_since: int, initial: Sequence[int], carry_initial: bool,
                  n_text_ctx: int) -> list[int]:
    """The prompt of the next window: ``text`` is every token so far (the initial prompt's ``initial`` first, then
    each kept segment's), ``reset_since`` where the prompt was last reset (a high temperature, the speech guard,
    condition_on_previous_text off). openai-whisper 20250625's transcribe(): without ``carry_initial_prompt`` the
    tokens since the reset (the initial prompt among them until the first reset); with it, the initial prompt and
    then the tokens since the reset, past the initial prompt, that fit in n_text_ctx // 2 - 1 with it (after a
    reset the initial prompt alone). As openai's, an initial prompt of that length or more leaves the slice
    ``[-remaining:]`` at zero or below (the whole text, or its start dropped), and the decoder then keeps the
    prompt's last n_text_ctx // 2 - 1 tokens (``decoding``): the initial prompt's start is cut."""
    if not carry_initial:
        return list(text[reset_since:])
    ignored = max(len(initial), reset_since)
    remaining = n_text_ctx // 2 - 1 - len(initial)
    return [*initial, *list(text[ignored:])[-remaining:]]


def prompt_head(sot_prev: int, prompt: Sequence[int], hotwords: Sequence[int], n_text_ctx: int) -> list[int]:
    """<|startofprev|>, the hotwords, then the previous text: faster-whisper's get_prompt (the hotwords' first and
    the prompt's last n_text_ctx // 2 - 1 tokens each); nothing when there is neither. Beyond it, the two keep at
    most three quarters of the decoder's positions, the previous text cut first: the sampled text always has a
    quarter, where faster-whisper's long hotwords beside a long previous text run out of positions (its issue 1022:
    "No position encodings are defined for positions >= 448")."""
    half = n_text_ctx // 2 - 1
    hotwords = list(hotwords[:half])
    if not prompt and not hotwords:
        return []
    keep = min(half, n_text_ctx * 3 // 4 - 1 - len(hotwords))
    return [sot_prev, *hotwords, *prompt[max(0, len(prompt) - keep) :]]
