"""Decoding one 30 s window as openai-whisper does it, driving the components from numpy.

Prefix (optional ``<|startofprev|>`` prompt, the sot sequence, an optional prefix) goes through the multi-token
decoder in one call, or partly from the prefill table; then one token per TextDecoder call with the logit
filters below, greedy at temperature 0 and sampling (best of N, batched) above it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .active_rows import ActiveRows
from .audio import TIME_PRECISION
from .errors import WhisperaneError
from .language import choose_language
from .options import DecodingOptions, token_ids
from .prompts import prompt_head
from .repetition import compression_ratio, cut_loop
from .runtime.decoder_adapters import CrossAttention, logsumexp
from .runtime.model import WhisperaneModel
from .runtime.state import DecoderState
from .tokenizer import Tokenizer


@dataclass(frozen=True)
class DecodingResult:
    tokens: list[int]  # sampled tokens up to (without) <|endoftext|>: text and timestamps
    text: str
    language: str
    language_probs: dict[str, float] | None
    avg_logprob: float
    sum_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    # Cross-attention of the alignment heads for the rows that predicted each sampled token and the final
    # <|endoftext|>: [A, len(tokens) + 1, F]; the decode-time alternative to a teacher-forced alignment pass.
    alignment: np.ndarray | None = field(default=None, repr=False, compare=False)
    token_logprobs: list[float] = field(default_factory=list, repr=False)
    # Stopped in a loop (``DecodingOptions.stop_at_repetition``): ``tokens`` end before the loop; openai's decoding
    # would have gone on to the token limit, its compression ratio over the threshold. A file's (``loop_ratio``)
    # log-probabilities are those of all it decoded, the loop's too, as openai's checks would see them.
    looped: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("alignment")
        return d


def log_softmax(x: np.ndarray) -> np.ndarray:
    return x - logsumexp(x)


# --- logit filters (openai-whisper's) -------------------------------------------------------------------


class LogitFilter:
    def apply(self, logits: np.ndarray, tokens: list[list[int]]) -> None:
        """Modify ``logits`` [B, V] in place given the tokens so far of each sequence."""
        raise NotImplementedError


class SuppressBlank(LogitFilter):
    """No blank or <|endoftext|> as the first sampled token."""

    def __init__(self, blank_tokens: Sequence[int], sample_begin: int):
        self.blank = list(blank_tokens)
        self.sample_begin = sample_begin

    def apply(self, logits, tokens):
        if len(tokens[0]) == self.sample_begin:
            logits[:, self.blank] = -np.inf


class SuppressTokens(LogitFilter):
    def __init__(self, suppress: Sequence[int]):
        self.suppress = np.asarray(sorted(set(suppress)), dtype=np.int64)

    def apply(self, logits, tokens):
        logits[:, self.suppress] = -np.inf


class ApplyTimestampRules(LogitFilter):
    """Timestamps in pairs, never decreasing, forced first, and preferred when their total probability wins."""

    def __init__(self, tokenizer: Tokenizer, sample_begin: int, max_initial_timestamp_index: int | None):
        self.tokenizer = tokenizer
        self.sample_begin = sample_begin
        self.max_initial_timestamp_index = max_initial_timestamp_index

    def apply(self, logits, tokens):
        tb, eot = self.tokenizer.timestamp_begin, self.tokenizer.eot
        logits[:, self.tokenizer.no_timestamps] = -np.inf
        for k, seq_all in enumerate(tokens):
            seq = seq_all[self.sample_begin :]
            last_was_timestamp = len(seq) >= 1 and seq[-1] >= tb
            penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= tb
            if last_was_timestamp:
                if penultimate_was_timestamp:  # a pair just closed: text (or eot) next
                    logits[k, tb:] = -np.inf
                else:  # an opened timestamp must be closed: no text
                    logits[k, :eot] = -np.inf
            timestamps = [t for t in seq if t >= tb]
            if timestamps:
                # never decreasing; and a segment has nonzero length, which prevents infinite loops
                last = timestamps[-1] if last_was_timestamp and not penultimate_was_timestamp else timestamps[-1] + 1
                logits[k, tb:last] = -np.inf
        if len(tokens[0]) == self.sample_begin:
            logits[:, :tb] = -np.inf  # the first sampled token is a timestamp
            if self.max_initial_timestamp_index is not None:
                logits[:, tb + self.max_initial_timestamp_index + 1 :] = -np.inf
        # openai compares logsumexp(logprobs[tb:]) with max(logprobs[:tb]); both sides carry the same
        # normalizer, so the raw logits compare the same without a log-softmax over the vocabulary.
        timestamp_mass = logsumexp(logits[:, tb:])[:, 0]
        text_best = logits[:, :tb].max(axis=-1)
        for k in range(logits.shape[0]):
            if timestamp_mass[k] > text_best[k]:
                logits[k, :tb] = -np.inf


def suppress_token_ids(option: str | Iterable[int] | None, tokenizer: Tokenizer, default: Sequence[int]) -> list[int]:
    """openai-whisper's rule: "-1" stands for the default set (non-speech symbols and the special tokens)."""
    ids = list(token_ids(option) or ())
    if -1 in ids:
        ids = [t for t in ids if t >= 0] + list(default)
    ids += [tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm]
    ids.append(tokenizer.no_speech)
    return sorted(set(ids))


# --- language detection ---------------------------------------------------------------------------------


# --- the window decoder ---------------------------------------------------------------------------------


def _encode_text_or_tokens(tokenizer: Tokenizer, value: str | Sequence[int]) -> list[int]:
    return tokenizer.encode(" " + value.strip()) if isinstance(value, str) else [int(t) for t in value]


def _prompt_head(tokenizer: Tokenizer, prompt: str | Sequence[int] | None, options: DecodingOptions, n_ctx: int) -> list[int]:
    """``prompts.prompt_head``: the prompt after the hotwords, where no prefix is given (faster-whisper's rule)."""
    hotwords = _encode_text_or_tokens(tokenizer, options.hotwords) if options.hotwords and not options.prefix else []
    return prompt_head(tokenizer.sot_prev, _encode_text_or_tokens(tokenizer, prompt) if prompt else [], hotwords, n_ctx)


@dataclass(frozen=True)
class WindowPlan:
    """The forced tokens of one window's decoding and the rules its sampled tokens follow."""

    initial: list[int]  # <|startofprev|> prompt, the sot sequence, the prefix
    sot_index: int  # where <|startoftranscript|> is in ``initial``
    sample_len: int
    filters: list[LogitFilter]

    @property
    def sample_begin(self) -> int:
        return len(self.initial)


def sample_room(model: WhisperaneModel, sample_len: int, used: int) -> int:
    """How many tokens a row may sample after ``used`` positions of the decoder cache: ``sample_len``, or what
    the cache has left; an error where nothing fits."""
    room = min(sample_len, model.cache_length - used)
    if room < 1:
        raise WhisperaneError(f"the prompt leaves no room in the decoder cache ({model.cache_length} positions)")
    return room


def plan_window(model: WhisperaneModel, options: DecodingOptions, tokenizer: Tokenizer) -> WindowPlan:
    n_ctx = model.dims.n_text_ctx
    initial = _prompt_head(tokenizer, options.prompt, options, n_ctx)
    sot_index = len(initial)
    initial += list(tokenizer.sot_sequence_including_notimestamps if options.without_timestamps else tokenizer.sot_sequence)
    if options.prefix:
        initial += _encode_text_or_tokens(tokenizer, options.prefix)[-(n_ctx // 2) :]
    sample_begin = len(initial)
    sample_len = sample_room(model, options.sample_len or n_ctx // 2, sample_begin)
    filters: list[LogitFilter] = []
    if options.suppress_blank:
        blank = model.info.suppress_blank_tokens or (*tokenizer.encode(" "), tokenizer.eot)
        filters.append(SuppressBlank(list(blank), sample_begin))
    if options.suppress_tokens:
        filters.append(SuppressTokens(suppress_token_ids(options.suppress_tokens, tokenizer, model.info.suppress_tokens)))
    if not options.without_timestamps:
        max_ts = None
        if options.max_initial_timestamp is not None:
            max_ts = round(options.max_initial_timestamp / TIME_PRECISION)
        filters.append(ApplyTimestampRules(tokenizer, sample_begin, max_ts))
    return WindowPlan(initial, sot_index, sample_len, filters)


def decode(model: WhisperaneModel, enc: CrossAttention, options: DecodingOptions | None = None,
           tokenizer: Tokenizer | None = None, language_probs: dict[str, float] | None = None) -> DecodingResult:
    """Decode one window whose encoder output is ``enc``."""
    options = options or DecodingOptions()
    if model.is_multilingual and options.language is None:
        tokenizer, language_probs = choose_language(model, enc, None, options.task)
    elif tokenizer is None or tokenizer.language != (options.language if model.is_multilingual else "en") \
            or tokenizer.task != options.task:
        tokenizer = model.tokenizer(language=options.language, task=options.task)
    plan = plan_window(model, options, tokenizer)
    beam = options.beam_size if options.temperature == 0 and options.beam_size else None
    n_group = beam or ((options.best_of or 5) if options.temperature > 0 else 1)
    with model.decoding_state(n_group) as state:
        first = _prefill(model, state, enc, plan, tokenizer, options)
        if beam:
            hypotheses = _beam_search(model, state, enc, first[0], first[1], plan, tokenizer, options)
        else:
            rows = (np.repeat(first[0][None], n_group, axis=0), np.repeat(first[1][None], n_group, axis=0))
            hypotheses = _sample_loop(model, state, enc, *rows, plan, tokenizer, options)
    return _best_result(hypotheses, tokenizer, options, language_probs, no_speech_prob=first[2])


def decode_windows(model: WhisperaneModel, enc: CrossAttention, options: DecodingOptions, tokenizer: Tokenizer,
                   prompts: Sequence[Sequence[int] | None] | None = None) -> list[DecodingResult]:
    """Decode B windows at once (``enc`` holds B encoder outputs), greedily: one decoder call per step for all
    rows, each row at its own cache position with its own window's cross K/V, timestamp rules and stopping
    (a finished row keeps being fed <|endoftext|>, its results ignored). ``prompts``: each row's own
    previous-text tokens in place of ``options.prompt`` (rows then start at different positions)."""
    if options.temperature > 0 or options.beam_size:
        raise WhisperaneError("windows are decoded together greedily; decode a window alone to sample or beam")
    batch = enc.batch
    if prompts is None:
        prompts = [_encode_text_or_tokens(tokenizer, options.prompt) if options.prompt else None] * batch
    plan = plan_window(model, replace(options, prompt=None, hotwords=None), tokenizer)  # what rows share after it
    heads = [_prompt_head(tokenizer, p, options, model.dims.n_text_ctx) for p in prompts]
    limits = [sample_room(model, plan.sample_len, plan.sample_begin + len(h)) for h in heads]
    with model.decoding_state(batch) as state:
        if any(heads):
            _forward_prompts(model, state, heads, enc)
        logits, align = model.decoder.forward(state, np.repeat(np.asarray([plan.initial]), batch, axis=0), enc)
        no_speech = np.exp(log_softmax(logits[:, plan.sot_index].astype(np.float64))[:, tokenizer.no_speech])
        hypotheses = _sample_loop(model, state, enc, logits[:, -1], align[:, :, -1], plan, tokenizer, options,
                                  limits)
    return [_best_result([h], tokenizer, options, None, float(p)) for h, p in zip(hypotheses, no_speech, strict=True)]


def _forward_prompts(model: WhisperaneModel, state: DecoderState, heads: list[list[int]], cross) -> None:
    """Each row's own prompt into its cache, a row at a time: one padded call for all rows is slower and holds
    more."""
    for r, head in enumerate(heads):
        if head:
            with model.decoding_state(1) as alone:
                row_cross = cross.row(r) if cross.batch > 1 else cross
                model.decoder.forward(alone, np.asarray([head]), row_cross, need_logits=False)
                state.set_row(r, alone)


def _best_result(hypotheses: list[Hypothesis], tokenizer: Tokenizer, options: DecodingOptions,
                 language_probs, no_speech_prob: float) -> DecodingResult:
    """The hypothesis with the best length-normalised log-probability (openai's MaximumLikelihoodRanker), a sample
    stopped in a loop ranked on what ``Hypothesis.loop`` says, which is also its result's log-probability; where it
    ranks first, the result is ``looped``. A file's (``loop_ratio``) ranks before the others: openai's ranking sees
    its whole loop, whose tokens the model grows ever surer of, and chooses it over a sample that does not loop."""
    scores = []
    for h in hypotheses:
        logprob, length = h.loop or (h.sum_logprob, len(h.tokens))
        penalty = length if options.length_penalty is None else ((5 + length) / 6) ** options.length_penalty
        scores.append((h.loop is not None and options.loop_ratio is not None, logprob / max(penalty, 1e-9)))
    best = hypotheses[max(range(len(scores)), key=scores.__getitem__)]
    logprob, length = best.loop or (best.sum_logprob, len(best.tokens))
    text = tokenizer.decode(best.tokens).strip()
    alignment = np.stack(best.alignment[: len(best.tokens) + 1], axis=1) if best.alignment else None
    return DecodingResult(
        tokens=best.tokens, text=text, language=tokenizer.language, language_probs=language_probs,
        avg_logprob=float(logprob / (length + 1)), sum_logprob=float(logprob),
        no_speech_prob=no_speech_prob, temperature=options.temperature, compression_ratio=compression_ratio(text),
        alignment=alignment, token_logprobs=[float(x) for x in best.token_logprobs], looped=best.loop is not None,
    )


def _prefill(model: WhisperaneModel, state: DecoderState, enc: CrossAttention, plan: WindowPlan,
             tokenizer: Tokenizer, options: DecodingOptions) -> tuple[np.ndarray, np.ndarray, float]:
    """Fill the cache with the forced prefix (once, then copied to every row); return (logits that pick the
    first token [V], their alignment row [A, F], no-speech probability). A one-row state (greedy) takes the
    prefix itself: a second state only for the prefix would be one more cache resident for the whole run and a
    copy per window."""
    with contextlib.nullcontext(state) if state.batch == 1 else model.decoding_state(1) as batch1:
        initial, table_positions = plan.initial, 0
        if options.prefill == "table" and plan.sot_index == 0:
            # Only positions whose logits are not needed come from the table: the last prefix token still runs.
            table_positions = min(model.info.prefill_length, len(tokenizer.sot_sequence), len(initial) - 1)
        if table_positions:
            task_index = 1 if options.task == "translate" else 0
            lang_token = tokenizer.language_token if tokenizer.language_token is not None else 0
            k, v = model.prefill_table(task_index, lang_token)
            batch1.write(k[..., :table_positions], v[..., :table_positions])
        # The prompt before <|startoftranscript|> only fills the cache; logits are needed from sot on (the
        # no-speech probability at sot, the first token from the last position).
        first = max(plan.sot_index, table_positions)
        if first > table_positions:
            model.decoder.forward(batch1, np.asarray([initial[table_positions:first]]), enc, need_logits=False)
        logits, align = model.decoder.forward(batch1, np.asarray([initial[first:]]), enc)
        if batch1 is not state:
            state.copy_prefix_from(batch1)
    # Row 0 is <|startoftranscript|>'s; with the table, whose positions were never run, it is the first computed
    # row instead (WhisperKit's approximation).
    no_speech_prob = float(np.exp(log_softmax(logits[0, 0].astype(np.float64))[tokenizer.no_speech]))
    return logits[0, -1], align[0, :, -1], no_speech_prob


@dataclass
class Hypothesis:
    """One decoded continuation: its sampled tokens (without <|endoftext|>), their log-probabilities and the
    alignment-head attention of the rows that predicted each token and the final <|endoftext|>."""

    tokens: list[int]
    sum_logprob: float
    token_logprobs: list[float]
    alignment: list[np.ndarray]  # [A, F] per predicted token
    # Stopped in a loop, the loop cut (repetition.cut_loop): the log-probability and length it is ranked on.
    loop: tuple[float, int] | None = None

    def extended(self, token: int, logprob: float) -> Hypothesis:
        return Hypothesis([*self.tokens, token], self.sum_logprob + logprob, [*self.token_logprobs, logprob], self.alignment)

    def extended_final(self, logprob: float) -> Hypothesis:
        """Closed by <|endoftext|>: its log-probability counts, the token is not kept."""
        return Hypothesis(self.tokens, self.sum_logprob + logprob, self.token_logprobs, self.alignment)


def _sample_loop(model, state, cross, logits: np.ndarray, first_align: np.ndarray, plan: WindowPlan, tokenizer,
                 options, limits: Sequence[int] | None = None) -> list[Hypothesis]:
    """Greedy (temperature 0) or sampled continuations of B rows until every row ends: the samples of one
    window (``cross`` at batch 1) or one window per row (``cross`` at batch B). ``logits`` [B, V] and
    ``first_align`` [B, A, F] are the rows' predictions of their first token; ``limits``: each row's most
    sampled tokens (rows with prompts of their own have less room in the cache), plan.sample_len by default. With
    ``options.stop_at_repetition`` a row whose text starts to loop ends there, the loop cut (``cut_loop``)."""
    eot, tb, sample_len, n_group = tokenizer.eot, tokenizer.timestamp_begin, plan.sample_len, logits.shape[0]
    ends = [plan.sample_begin + n for n in (limits or [sample_len] * n_group)]
    tokens = [list(plan.initial) for _ in range(n_group)]
    sum_logprobs, token_logprobs = np.zeros(n_group), [[] for _ in range(n_group)]
    aligns, loops = [[a] for a in first_align], {}  # loops: row -> what it is ranked on (_stopped_in_a_loop)
    # numpy.random is imported only to sample: its import adds megabytes to a short file's peak
    rng = np.random.default_rng(options.seed) if options.temperature >= 1e-6 else None
    logits, active = logits.astype(np.float32), ActiveRows(state, cross, n_group)
    try:
        for i in range(sample_len):
            chosen, logprobs = _sample(logits, [tokens[k] for k in active.rows], plan, options, rng, active.noise_rows())
            for p, k in enumerate(active.rows):
                if tokens[k][-1] == eot or len(tokens[k]) >= ends[k]:  # ended, or out of room: fed <|endoftext|>
                    chosen[p] = eot
                else:
                    sum_logprobs[k] += logprobs[p]
                    token_logprobs[k].append(float(logprobs[p]))
                tokens[k].append(int(chosen[p]))
                # Only text can close a loop: after a timestamp the text is what was checked a token before.
                if options.stop_at_repetition and tb > chosen[p] != eot and (
                        loop := _stopped_in_a_loop(tokens[k], token_logprobs[k], sum_logprobs[k], plan, tokenizer, options)):
                    loops[k] = loop
                    sum_logprobs[k] = sum(token_logprobs[k])
            if all(tokens[k][-1] == eot for k in active.rows) or i == sample_len - 1 or active.state.length >= state.layout.length:
                break
            active.drop({k for k in active.rows if tokens[k][-1] == eot}, loops)
            logits, align = model.decoder.step(active.state, np.asarray([tokens[k][-1] for k in active.rows]), active.cross)
            for p, k in enumerate(active.rows):
                aligns[k].append(align[p])
    finally:
        active.restore()
    hypotheses = []
    for k in range(n_group):
        seq = tokens[k][plan.sample_begin :]
        seq = seq[: seq.index(eot)] if eot in seq else seq
        hypotheses.append(Hypothesis(seq, float(sum_logprobs[k]), token_logprobs[k][: len(seq)],
                                     aligns[k][: len(seq) + 1], loop=loops.get(k)))
    return hypotheses


def _stopped_in_a_loop(tokens: list[int], logprobs: list[float], logprob: float, plan: WindowPlan, tokenizer,
                       options) -> tuple[float, int] | None:
    """Where a row's sampled tokens end in a loop (``cut_loop``, which cuts it there; ``logprob``: their sum so
    far), the log-probability and length the row is ranked on: with ``options.loop_ratio`` (the decoding then
    fails as too repetitive) all it decoded, the loop too, as openai's ranking would see the loop it decodes to
    the end; else (an update, which keeps the text) its text before the loop. None: no loop."""
    decoded = (float(logprob), len(logprobs))
    if not cut_loop(tokens, logprobs, plan.sample_begin, tokenizer, options.loop_ratio):
        return None
    return decoded if options.loop_ratio is not None else (sum(logprobs), len(logprobs))


def _sample(logits: np.ndarray, tokens: list[list[int]], plan: WindowPlan, options, rng,
            noise_rows: tuple[int, list[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rows' next tokens after openai's filters, greedy or sampled, and their log-probabilities (only the
    chosen tokens' are needed, so no log-softmax of the vocabulary). ``noise_rows``: how many rows of sampling
    noise to draw and the rows' among them (``ActiveRows.noise_rows``); None: one row each."""
    for f in plan.filters:
        f.apply(logits, tokens)
    normalizer = logsumexp(logits)[:, 0]
    if options.temperature < 1e-6:  # below this, sampling is greedy (and would overflow)
        chosen = logits.argmax(axis=-1)
    else:
        if noise_rows is None:
            uniform = rng.uniform(1e-12, 1.0, size=logits.shape)
        else:
            uniform = rng.uniform(1e-12, 1.0, size=(noise_rows[0], logits.shape[1]))[noise_rows[1]]
        gumbel = -np.log(-np.log(uniform))
        chosen = (logits / options.temperature + gumbel).argmax(axis=-1)
    return chosen, logits[np.arange(len(chosen)), chosen] - normalizer


def _beam_search(model, state, enc, first_logits, first_align, plan: WindowPlan, tokenizer, options) -> list[Hypothesis]:
    """openai-whisper's beam search: every beam proposes its beam_size + 1 best tokens; the best beam_size
    unfinished candidates continue (their caches gathered into place), finished ones are collected up to
    round(beam_size * patience); beams still open at the end are closed with <|endoftext|> if too few finished.
    One decoder call per step runs every beam against the window's batch-1 cross K/V."""
    beam, eot = options.beam_size, tokenizer.eot
    max_candidates = round(beam * (options.patience or 1.0))
    beams = [Hypothesis([], 0.0, [], [first_align])] * beam
    logits = np.repeat(first_logits[None, :].astype(np.float32), beam, axis=0)
    finished: dict[tuple[int, ...], Hypothesis] = {}
    for i in range(plan.sample_len):
        for f in plan.filters:
            f.apply(logits, [plan.initial + h.tokens for h in beams])
        # Only each row's beam + 1 best tokens are ranked: one partition of the batch, no vocabulary-wide log-softmax.
        top = np.argpartition(-logits, beam, axis=-1)[:, : beam + 1]
        top_logprobs = np.take_along_axis(logits, top, axis=-1) - logsumexp(logits)
        beams, sources, newly_finished = _rank_candidates(beams, top, top_logprobs, eot)
        for seq, hyp in newly_finished:
            if len(finished) >= max_candidates:
                break  # the candidate list is full
            finished[seq] = hyp
        if len(finished) >= max_candidates or i == plan.sample_len - 1 or state.length >= state.layout.length:
            break
        state.select(np.asarray(sources))
        logits, align = model.decoder.step(state, np.array([h.tokens[-1] for h in beams]), enc)
        beams = [Hypothesis(h.tokens, h.sum_logprob, h.token_logprobs, [*h.alignment, align[k]]) for k, h in enumerate(beams)]
    for h in sorted(beams, key=lambda h: h.sum_logprob, reverse=True):  # not enough finished: close open beams
        if len(finished) >= beam:
            break
        finished.setdefault((*h.tokens, eot), h)
    return list(finished.values())


def _rank_candidates(beams: list[Hypothesis], top: np.ndarray, top_logprobs: np.ndarray, eot: int):
    """The next beams (best first), the row each came from, and the candidates that end with <|endoftext|>
    (best first), as openai's BeamSearchDecoder.update ranks them; ``top`` [B, beam + 1] holds each row's best
    tokens, ``top_logprobs`` their log-probabilities."""
    beam = top.shape[1] - 1
    scores: dict[tuple[int, ...], tuple[float, int, int, float]] = {}
    for j, h in enumerate(beams):
        for k in np.argsort(-top_logprobs[j], kind="stable"):
            token, lp = int(top[j, k]), float(top_logprobs[j, k])
            scores[(*h.tokens, token)] = (h.sum_logprob + lp, j, token, lp)
    next_beams, sources, finished = [], [], []
    for seq, (_score, j, token, lp) in sorted(scores.items(), key=lambda kv: kv[1][0], reverse=True):
        if token == eot:
            finished.append((seq, beams[j].extended_final(lp)))
        else:
            next_beams.append(beams[j].extended(token, lp))
            sources.append(j)
            if len(next_beams) == beam:
                break
    return next_beams, sources, finished
