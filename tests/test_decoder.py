"""The batch-B decoder core (docs/DESIGN.md §8) on real speech, for each ONNX decoder adapter: rows at their own cache
positions decode as they do alone, beams reordered by ``select`` continue as their sources would, and the
window's batch-1 cross K/V serve every row with the same numbers as B copies of them; the decoder graphs never
tile or expand the encoder's K/V."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import CLIPS, DATA_CLIPS

from whisperane.audio import load_audio

# Logits of the same token through the same graph at another batch size: ONNX Runtime's kernels may block the
# batch differently, so equal up to float32 rounding (measured max |diff| ~1e-4 on logits of magnitude ~30).
ATOL = 2e-3


@pytest.fixture(scope="module", params=["int8", "float32"])
def model(request):
    """tiny.en with each compute type's decoder adapter: conftest's session models (two threads), which other
    modules load too; the tests here patch them only through monkeypatch, which puts everything back."""
    return request.getfixturevalue({"int8": "tiny_int8_model", "float32": "tiny_float32_model"}[request.param])


@pytest.fixture(scope="module")
def window(model):
    return model.encode(model.log_mel(load_audio(str(CLIPS["jfk"].path))))


def prefix(model, n_text: int) -> list[int]:
    tok = model.tokenizer()
    text = tok.encode(" And so my fellow Americans ask not")[:n_text]
    return [*tok.sot_sequence_including_notimestamps, *text]


def run_alone(model, window, tokens: list[int], then: int):
    """Logits of ``then`` after ``tokens`` in a state of its own."""
    with model.decoding_state(1) as state:
        model.decoder.forward(state, np.asarray([tokens]), window, need_logits=False)
        logits, align = model.decoder.step(state, np.array([then]), window)
    return logits[0], align[0]


def fill_rows(model, window, batch, prompts: list[list[int]]) -> None:
    """Each row of ``batch`` decoded through its own prompt, apart (rows at different cache positions)."""
    for r, tokens in enumerate(prompts):
        with model.decoding_state(1) as alone:
            model.decoder.forward(alone, np.asarray([tokens]), window, need_logits=False)
            batch.set_row(r, alone)


def test_rows_at_their_own_positions_decode_as_alone(model, window):
    prompts = [prefix(model, 2), prefix(model, 6)]  # two rows at different cache positions
    nxt = model.tokenizer().encode(" what")[0]
    with model.decoding_state(2) as batch:
        fill_rows(model, window, batch, prompts)
        assert list(batch.lengths) == [len(p) for p in prompts]
        logits, align = model.decoder.step(batch, np.array([nxt, nxt]), window)
    for r, tokens in enumerate(prompts):
        want_logits, want_align = run_alone(model, window, tokens, nxt)
        np.testing.assert_allclose(logits[r], want_logits, atol=ATOL)
        np.testing.assert_allclose(align[r], want_align, atol=1e-4)
    assert np.abs(logits[0] - logits[1]).max() > 0.1  # the rows really are different contexts


def test_selected_rows_continue_as_their_sources(model, window):
    prompts = [prefix(model, 1), prefix(model, 3), prefix(model, 5)]
    nxt = model.tokenizer().encode(" country")[0]
    with model.decoding_state(3) as batch:
        fill_rows(model, window, batch, prompts)
        order = np.array([2, 0, 2])
        batch.select(order)
        logits, _ = model.decoder.step(batch, np.array([nxt] * 3), window)
    for r, source in enumerate(order):
        np.testing.assert_allclose(logits[r], run_alone(model, window, prompts[source], nxt)[0], atol=ATOL)


def test_shared_cross_attention_equals_copies(model, window):
    tokens = np.asarray([prefix(model, 4)] * 3)
    copies = type(window)({k: np.ascontiguousarray(np.repeat(v, 3, axis=0)) for k, v in window.feeds.items()}, 3)
    results = []
    for cross in (window, copies):
        with model.decoding_state(3) as state:
            logits, align = model.decoder.forward(state, tokens, cross)
        results.append((logits, align))
    np.testing.assert_allclose(results[0][0], results[1][0], atol=ATOL)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-4)


@pytest.mark.slow
def test_windows_with_their_own_prompts_decode_as_alone(model, monkeypatch):
    """decode_windows (batched mode's step): three windows side by side, two with previous-text prompts of
    different lengths and one without (rows at different cache positions from their prompts on), give each
    window's greedy decoding alone with its own prompt. Rows leave the batch as they finish (each step runs
    fewer rows; their cross K/V swapped into place), and the windows' cross K/V are back in order after."""
    from dataclasses import replace

    from whisperane.decoding import decode, decode_windows
    from whisperane.options import DecodingOptions

    names = ["jfk", "1089-134691-0001", "LJ001-0002"]
    enc = model.encode(np.concatenate([model.log_mel(load_audio(str(DATA_CLIPS[n][0]))) for n in names]))
    tok = model.tokenizer()
    prompts = [tok.encode(" He hoped there would be stew for dinner, turnips and carrots and bruised potatoes."),
               None, tok.encode(" Printing.")]
    options = DecodingOptions(language="en")
    before = {k: v.copy() for k, v in enc.feeds.items()}
    rows, step = [], model.decoder.step
    monkeypatch.setattr(model.decoder, "step", lambda state, tokens, cross: (rows.append(len(tokens)), step(state, tokens, cross))[1])
    together = decode_windows(model, enc, options, tok, prompts)
    monkeypatch.undo()
    batched = rows[rows.index(3) :]  # after the prompts, which run a row at a time
    assert batched[-1] == 1 and batched == sorted(batched, reverse=True), rows
    for name, value in before.items():
        np.testing.assert_array_equal(enc.feeds[name], value)
    for i, prompt in enumerate(prompts):
        alone = decode(model, enc.row(i), replace(options, prompt=prompt), tok)
        assert together[i].tokens == alone.tokens, names[i]
        assert together[i].text.strip()
        assert abs(together[i].avg_logprob - alone.avg_logprob) < 1e-3
        assert abs(together[i].no_speech_prob - alone.no_speech_prob) < 1e-3


def _ancestors(graph: onnx.GraphProto, name: str) -> set[str]:
    producers = {out: node for node in graph.node for out in node.output}
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in producers:
            todo.extend(producers[current].input)
    return seen


@pytest.mark.parametrize("name", ["TextDecoder.onnx", "TextDecoderSequence.onnx", "TextDecoderSequence.int8.onnx"])
def test_decoder_graphs_never_copy_the_cross_attention_inputs(tiny_en_bundle, name):
    graph = onnx.load(str(tiny_en_bundle / name), load_external_data=False).graph
    cross_inputs = {i.name for i in graph.input if i.name.startswith("encoder_attn_")}
    assert cross_inputs
    copies = [n for n in graph.node if n.op_type in ("Tile", "Expand")]
    for node in copies:
        assert not (_ancestors(graph, node.input[0]) & cross_inputs), (node.op_type, node.name)


def _scoring_graph(model):
    """The decoder graph that runs the alignment pass (the one-hot adapter's TextDecoderSequence), with the
    variants its converter revision gives, as the decoder reads them at load time."""
    from whisperane.runtime.decoder_adapters import SequenceGraph

    sequence = getattr(model.decoder, "sequence", None)
    return SequenceGraph.of(sequence() if sequence is not None else model.decoder.component)


@pytest.mark.slow
def test_alignment_pass_probabilities_from_the_graph_equal_the_hosts(model, window, monkeypatch):
    """The graph's text-vocabulary log-probabilities (converter revision 12 on) against the host's
    normalisation of the same pass's logits (``Decoder.score``, the path of older bundles): equal to float32
    rounding; on real clips the same words, the same word times, and probabilities equal at the 4 decimals
    the output keeps (a last-decimal rounding flip allowed)."""
    from whisperane.runtime.decoder_adapters import Decoder
    from whisperane.transcribe import transcribe

    tok = model.tokenizer()
    text = tok.encode(" And so my fellow Americans, ask not what your country can do for you,")
    tokens = np.asarray([[*tok.sot_sequence, tok.no_timestamps, *text, tok.eot]])
    args = (window, len(tok.sot_sequence), np.asarray([text]), tok.eot)
    with model.decoding_state(1) as state:
        graph, graph_weights = model.decoder.score(state, tokens, *args)
    with model.decoding_state(1) as state:
        host, host_weights = Decoder.score(model.decoder, state, tokens, *args)
    assert graph.shape == host.shape == (1, len(text))
    np.testing.assert_allclose(graph, host, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(graph_weights, host_weights)

    def words(result):
        return [(w.word, w.start, w.end, w.probability) for s in result.segments for w in s.words]

    for name in ("jfk", "1089-134691-0001", "LJ001-0002"):
        audio = load_audio(str(DATA_CLIPS[name][0]))
        from_graph = words(transcribe(audio, model))
        with monkeypatch.context() as patch:
            patch.setattr(type(model.decoder), "score", Decoder.score)
            from_host = words(transcribe(audio, model))
        assert [w[:3] for w in from_graph] == [w[:3] for w in from_host], name
        assert max(abs(a[3] - b[3]) for a, b in zip(from_graph, from_host, strict=True)) <= 1.5e-4, name


@pytest.mark.parametrize("name", ["TextDecoder.onnx", "TextDecoderSequence.onnx", "TextDecoderSequence.int8.onnx"])
def test_decoder_graphs_reshape_heads_to_constant_targets(tiny_en_bundle, name):
    """Head splits and merges are exported with constant targets (``layers.reshape``), not traced from the
    inputs' shapes: converter revision 14's TextDecoderSequence computed 42 of its 44 reshape targets at run time
    through 118 Shape operations (214 of the one-token step's 392 nodes after ONNX Runtime's optimizer were
    shape arithmetic; 251 nodes now, 9 % faster a step). What may remain are the outputs' own reshapes (the
    logits' rows, the log-probabilities' [B, Q]) and, from revision 17, one Shape for the call's token count
    (``layers.tail_start``)."""
    graph = onnx.load(str(tiny_en_bundle / name), load_external_data=False).graph
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    reshapes = [n for n in graph.node if n.op_type == "Reshape"]
    computed = [n.name for n in reshapes if n.input[1] not in constants]
    assert len(reshapes) > 30 and len(computed) <= 2, computed
    assert sum(n.op_type == "Shape" for n in graph.node) <= 7


def test_calls_on_an_empty_state_take_no_cache_positions_and_change_nothing(model, window, monkeypatch):
    """A prompt and the alignment pass run on an empty state (converter revision 16 on): the graph gets caches of
    no positions rather than S masked ones, and gives what it gives with all S (the same K/V written, the same
    logits, word probabilities and alignment weights, to float32 rounding: bitwise where measured)."""
    from whisperane.runtime.decoder_adapters import DecoderState, StatePool

    tok = model.tokenizer()
    text = tok.encode(" And so my fellow Americans, ask not what your country can do for you,")
    prompt = np.asarray([[tok.sot_prev, *text]])
    scored = np.asarray([[*tok.sot_sequence, tok.no_timestamps, *text, tok.eot]])
    args = (window, len(tok.sot_sequence), np.asarray([text]), tok.eot)
    seen, feeds = [], DecoderState.call_feeds

    def runs(any_length_allowed: bool):
        def recorded(state, any_length):
            out = feeds(state, any_length and any_length_allowed)
            seen.append(out["decoder_key_padding_mask"].shape[1])
            return out

        monkeypatch.setattr(DecoderState, "call_feeds", recorded)
        if not any_length_allowed:  # all S positions, as a state of fixed length holds them
            monkeypatch.setattr(model.decoder, "pool", StatePool(lambda batch: DecoderState(model.decoder.layout, batch)))
        with model.decoding_state(1) as state:
            logits, _ = model.decoder.forward(state, prompt, window)
            cache = [c[..., : prompt.shape[1]].copy() for c in (*state.keys, *state.values)]
        with model.decoding_state(1) as state:
            probabilities, weights = model.decoder.score(state, scored, *args)
        return [logits, *cache, probabilities, weights]

    empty, full = runs(True), runs(False)
    assert seen == [0, 0, model.decoder.layout.length, model.decoder.layout.length]
    for x, y in zip(empty, full, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_a_prompt_skips_the_last_layers_tail_and_writes_the_same_cache(model, window, monkeypatch):
    """A call that reads no position's logits or log-probabilities (a prompt) runs the last layer's queries,
    cross-attention and MLP on no rows (converter revision 17; tiny.en int8, 217 tokens: 37.2 -> 28.9 ms): the
    K/V it writes are those of the same call with every position's logits, bitwise, and of its alignment weights
    (each layer's heads a block of rows) the last layer's heads have none where the other call's have a row per
    token."""
    tok = model.tokenizer()
    prompt = np.asarray([[tok.sot_prev, *tok.encode(" And so my fellow Americans, ask not what your country can do")]])
    graph, calls = _scoring_graph(model).component, []
    run = graph.run
    monkeypatch.setattr(graph, "run", lambda feeds, outputs=None: calls.append(dict(feeds)) or run(feeds, outputs))
    caches = []
    for need_logits in (False, True):
        with model.decoding_state(1) as state:
            model.decoder.forward(state, prompt, window, need_logits=need_logits)
            caches.append([c[..., : prompt.shape[1]].copy() for c in (*state.keys, *state.values)])
    for skipped, whole in zip(*caches, strict=True):
        np.testing.assert_array_equal(skipped, whole)
    rows = [run(feeds, ["alignment_heads_weights"])["alignment_heads_weights"].shape[1] for feeds in calls]
    heads, last = model.info.alignment_heads, model.info.dims.n_text_layer - 1
    in_last = sum(layer == last for layer, _ in heads)
    assert in_last > 0  # tiny.en's last layer has alignment heads: the test sees the skip in their rows
    assert rows == [(len(heads) - in_last) * prompt.shape[1], len(heads) * prompt.shape[1]]


def _same_rows(growing, fixed) -> None:
    """Every row's filled positions, mask and position equal in a GrowingState and a fixed-length state."""
    from whisperane.contract import MASK_VALUE

    np.testing.assert_array_equal(growing.lengths, fixed.lengths)
    for r, n in enumerate(fixed.lengths.tolist()):
        for mine, theirs in zip((*growing.keys, *growing.values), (*fixed.keys, *fixed.values), strict=True):
            np.testing.assert_array_equal(mine[r, ..., :n], theirs[r, ..., :n])
        assert (growing.padding[r, :n] == 0).all() and (growing.padding[r, n:] == MASK_VALUE).all()
        assert (fixed.padding[r, :n] == 0).all()


def test_a_growing_state_holds_what_a_fixed_one_holds():
    """GrowingState (caches of the filled positions only, for graphs that take any length) through the state
    operations the decoding loops use: writes that cross its capacity blocks, rows at their own positions, views
    of the first rows written to, rows set from other states, a prefix copied to every row, beams selected,
    reset. After each, every row's positions equal those of a fixed-length DecoderState given the same calls."""
    from whisperane.runtime.state import CAPACITY_BLOCK, CacheLayout, DecoderState, GrowingState

    layout = CacheLayout(n_layer=2, dim=8, length=3 * CAPACITY_BLOCK + 5, per_layer=True)
    rng = np.random.default_rng(0)
    growing, fixed = GrowingState(layout, 3), DecoderState(layout, 3)

    def write(states, rows: int, t: int) -> None:
        kv = rng.standard_normal((2, rows, 2 * layout.dim, 1, t)).astype(np.float32)
        for s in states:
            s.write(kv[0], kv[1])

    write((growing, fixed), 3, 5)
    assert growing.keys[0].shape[-1] == CAPACITY_BLOCK  # the step reads 64 positions, not all S
    write((growing, fixed), 3, CAPACITY_BLOCK)  # crosses the first block
    assert growing.keys[0].shape[-1] == 2 * CAPACITY_BLOCK
    _same_rows(growing, fixed)
    kv = rng.standard_normal((2, 1, 2 * layout.dim, 1, 2 * CAPACITY_BLOCK + 7)).astype(np.float32)
    alone = GrowingState(layout, 1), DecoderState(layout, 1)
    for a in alone:
        a.write(kv[0], kv[1])
    growing.set_row(1, alone[1])  # rows from a state of the other kind: masks of different widths
    fixed.set_row(1, alone[0])
    _same_rows(growing, fixed)  # row 1 ahead of the others, past the second block
    views = growing.first_rows(2), fixed.first_rows(2)
    write(views, 2, 3)  # the views' rows move on; row 2 stays
    _same_rows(growing, fixed)
    for s in (growing, fixed):
        s.select(np.array([1, 1, 0]))
    _same_rows(growing, fixed)
    write((growing, fixed), 3, 1)
    _same_rows(growing, fixed)
    prefix = GrowingState(layout, 1)
    prefix.write(*rng.standard_normal((2, 1, 2 * layout.dim, 1, 9)).astype(np.float32))
    for s in (growing, fixed):
        s.reset()
        s.copy_prefix_from(prefix)
    assert growing.keys[0].shape[-1] == CAPACITY_BLOCK  # reset: back to the first block
    _same_rows(growing, fixed)
    write((growing, fixed), 3, layout.length - 9)  # to the last position: the capacity is S, not more
    assert growing.keys[0].shape[-1] == layout.length
    _same_rows(growing, fixed)


def test_steps_on_a_growing_state_give_what_all_positions_give(model, window, monkeypatch):
    """The int8 decoder's states hold only the filled positions (GrowingState): a 100-token prompt and steps past
    it, across two capacity blocks, give the logits, alignment weights and caches that the same calls give on a
    state of all S positions (bitwise where measured)."""
    from whisperane.runtime.decoder_adapters import AppendingDecoder
    from whisperane.runtime.state import CAPACITY_BLOCK, DecoderState, GrowingState, StatePool

    with model.decoding_state(1) as state:
        # the contract's TextDecoder (float32 here, Core ML) takes all S positions: its states never grow
        assert isinstance(state, GrowingState) == isinstance(model.decoder, AppendingDecoder)
    if not isinstance(state, GrowingState):
        return
    tok = model.tokenizer()
    text = tok.encode(" And so my fellow Americans, ask not what your country can do for you, ask what you can do") * 8
    prompt = np.asarray([[tok.sot_prev, *text[: 2 * CAPACITY_BLOCK - 10]]])
    nxt = np.asarray(text[:30])
    results = []
    for pool in (model.decoder.pool, StatePool(lambda batch: DecoderState(model.decoder.layout, batch))):
        monkeypatch.setattr(model.decoder, "pool", pool)
        with model.decoding_state(1) as state:
            model.decoder.forward(state, prompt, window, need_logits=False)
            steps = [model.decoder.step(state, nxt[i : i + 1], window) for i in range(len(nxt))]
            n = int(state.lengths[0])
            results.append([*(x for s in steps for x in s), *(c[..., :n].copy() for c in (*state.keys, *state.values))])
    assert n > 2 * CAPACITY_BLOCK
    for x, y in zip(*results, strict=True):
        np.testing.assert_array_equal(x, y)
