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
    """<|startofprev|>, the hotwords (faster-whisper's get_prompt: at most n_text_ctx // 2 - 1 tokens, before the
    previous text), then the prompt's last tokens: openai's n_text_ctx // 2 - 1 of them, less the hotwords' (the
    sampled text keeps its n_text_ctx // 2 positions, where faster-whisper would keep as much previous text and
    overrun the context); nothing when there is neither."""
    room = n_text_ctx // 2 - 1
    hotwords = list(hotwords[:room])
    if not prompt and not hotwords:
        return []
    return [sot_prev, *hotwords, *prompt[max(0, len(prompt) - (room - len(hotwords))) :]]
