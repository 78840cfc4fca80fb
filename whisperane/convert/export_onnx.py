"""ONNX export of the components (fp32, weights as initializers so later quantization can reach them)."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch

from .. import contract
from ..contract import (
    ALIGNMENT_WEIGHTS,
    AUDIO,
    CACHE_LENGTH,
    CROSS_KEY,
    CROSS_VALUE,
    ENCODER_OUTPUT,
    INPUT_IDS,
    KEY_CACHE,
    KEY_PREFILL,
    KEY_UPDATES,
    LOGIT_POSITIONS,
    LOGITS,
    LOGPROB_POSITIONS,
    LOGPROB_TOKENS,
    MEL_FEATURES,
    PADDING_MASK,
    PREFILL_LANGUAGE,
    PREFILL_TASK,
    TOKEN_LOGPROBS,
    UPDATE_MASK,
    VALUE_CACHE,
    VALUE_PREFILL,
    VALUE_UPDATES,
)
from ..dims import ModelDimensions
from . import modules

OPSET = 17
CACHE_POSITIONS = "cache_positions"  # TextDecoderSequence's dynamic cache length


def _export(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], dynamic: dict) -> Path:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    if embedding_name(onnx.load(str(path), load_external_data=False)):
        tie_output_projection(path)
    return path


def embedding_name(model: onnx.ModelProto) -> str | None:
    """The token embedding initializer's name (prefixed when the decoder was exported inside a wrapper)."""
    return next((i.name for i in model.graph.initializer if i.name.endswith("token_embedding.weight")), None)


def tie_output_projection(path: Path) -> None:
    """Make the logits Gemm read the token embedding itself (transB=1) instead of a folded transposed copy.

    The exporter writes ``linear(x, W)`` as ``MatMul(x, W^T)`` and constant folding stores W^T as a second
    initializer: for tiny.en that is 80 MB more on disk and in memory, read on every decoder step.
    """
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    emb = inits[embedding_name(model)]
    v, d = emb.dims
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in inits and list(inits[node.input[1]].dims) == [d, v]:
            copy = node.input[1]
            gemm = onnx.helper.make_node("Gemm", [node.input[0], emb.name], list(node.output), name=node.name + "_tied", transB=1)
            idx = list(model.graph.node).index(node)
            model.graph.node.remove(node)
            model.graph.node.insert(idx, gemm)
            if not any(copy in n.input for n in model.graph.node):
                model.graph.initializer.remove(inits[copy])
            break
    onnx.save(model, str(path))


def export_mel(module, path: Path) -> Path:
    audio = torch.zeros(480000)
    return _export(module, (audio,), path, [AUDIO], [MEL_FEATURES], {})


def export_encoder(module, dims: ModelDimensions, path: Path, per_layer: bool = False) -> Path:
    """The contract's encoder, or (``per_layer``) one cross K and V output per decoder layer
    (``encoder_attn_key_cache_{i}``, :class:`modules.PerLayerOutputs`)."""
    mel = torch.zeros(1, dims.n_mels, 1, 3000)
    outs = [ENCODER_OUTPUT, CROSS_KEY, CROSS_VALUE]
    if per_layer:
        module = modules.PerLayerOutputs(module)
        outs = [outs[0], *(f"{name}_{i}" for name in outs[1:] for i in range(dims.n_text_layer))]
    dyn = {n: {0: "batch"} for n in [MEL_FEATURES, *outs]}
    return _export(module, (mel,), path, [MEL_FEATURES], outs, dyn)


def decoder_example(dims: ModelDimensions, cache_length: int, batch: int = 1):
    dl = dims.n_text_state * dims.n_text_layer
    s = cache_length
    return {
        INPUT_IDS: torch.zeros(batch, dtype=torch.int32),
        CACHE_LENGTH: torch.zeros(batch, dtype=torch.int32),
        KEY_CACHE: torch.zeros(batch, dl, 1, s),
        VALUE_CACHE: torch.zeros(batch, dl, 1, s),
        UPDATE_MASK: torch.zeros(batch, s),
        PADDING_MASK: torch.zeros(batch, s),
        CROSS_KEY: torch.zeros(1, dl, 1, dims.n_audio_ctx),
        CROSS_VALUE: torch.zeros(1, dl, 1, dims.n_audio_ctx),
    }


DECODER_OUTPUTS = list(contract.DECODER_OUTPUTS)
SEQUENCE_OUTPUTS = [*DECODER_OUTPUTS, TOKEN_LOGPROBS]


def per_layer_inputs(ex: dict, dims: ModelDimensions) -> dict:
    """An example with one input per layer for each cache (``key_cache_{i}``, ``encoder_attn_key_cache_{i}``...),
    in :class:`modules.PerLayerInputs`' order."""
    def split(name: str) -> dict:
        t = ex[name]
        d = dims.n_text_state
        return {f"{name}_{i}": t[:, i * d : (i + 1) * d] for i in range(dims.n_text_layer)}

    masks = {n: t for n, t in ex.items() if n.endswith("_mask")}
    return {INPUT_IDS: ex[INPUT_IDS], CACHE_LENGTH: ex[CACHE_LENGTH], **split(KEY_CACHE), **split(VALUE_CACHE),
            **masks, **split(CROSS_KEY), **split(CROSS_VALUE),
            **{n: t for n, t in ex.items() if n in modules.SEQUENCE_SELECTORS}}


def export_decoder(module, dims: ModelDimensions, cache_length: int, path: Path) -> Path:
    ex = decoder_example(dims, cache_length)
    dyn = {n: {0: "batch"} for n in ex if not n.startswith((CROSS_KEY, CROSS_VALUE))}
    dyn.update({n: {0: "encoder_batch"} for n in ex if n.startswith((CROSS_KEY, CROSS_VALUE))})
    dyn.update({n: {0: "batch"} for n in DECODER_OUTPUTS})
    return _export(module, tuple(ex.values()), path, list(ex), DECODER_OUTPUTS, dyn)


def export_decoder_sequence(module, dims: ModelDimensions, cache_length: int, path: Path, per_layer: bool = False) -> Path:
    ex = decoder_example(dims, cache_length)
    del ex[UPDATE_MASK]
    ex[INPUT_IDS] = torch.zeros(1, 3, dtype=torch.int32)
    ex[LOGIT_POSITIONS] = torch.arange(3, dtype=torch.int32)
    ex[LOGPROB_POSITIONS] = torch.arange(1, 3, dtype=torch.int32)
    ex[LOGPROB_TOKENS] = torch.zeros(1, 2, dtype=torch.int32)
    if per_layer:
        ex, module = per_layer_inputs(ex, dims), modules.PerLayerInputs(module)
    dyn = {n: {0: "batch"} for n in ex if not n.startswith((CROSS_KEY, CROSS_VALUE))}
    # The cached positions are as many as the host passes: all S, or none for a call on an empty state (a prompt,
    # the alignment pass), whose attention then skips S masked positions.
    dyn.update({n: {0: "batch", 3: CACHE_POSITIONS} for n in ex if n.startswith((KEY_CACHE, VALUE_CACHE))})
    dyn[PADDING_MASK] = {0: "batch", 1: CACHE_POSITIONS}
    dyn[INPUT_IDS] = {0: "batch", 1: "tokens"}
    dyn[LOGIT_POSITIONS] = {0: "positions"}
    dyn[LOGPROB_POSITIONS] = {0: "scored"}
    dyn[LOGPROB_TOKENS] = {0: "batch", 1: "scored"}
    dyn.update({n: {0: "encoder_batch"} for n in ex if n.startswith((CROSS_KEY, CROSS_VALUE))})
    dyn.update({LOGITS: {0: "positions_x_batch"}, KEY_UPDATES: {0: "batch", 3: "tokens"},
                VALUE_UPDATES: {0: "batch", 3: "tokens"}, ALIGNMENT_WEIGHTS: {0: "batch", 1: "head_rows"},
                TOKEN_LOGPROBS: {0: "batch", 1: "scored"}})
    return _export(module, tuple(ex.values()), path, list(ex), SEQUENCE_OUTPUTS, dyn)


def export_prefill(module, path: Path) -> Path:
    args = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    return _export(module, args, path, [PREFILL_TASK, PREFILL_LANGUAGE], [KEY_PREFILL, VALUE_PREFILL], {})
