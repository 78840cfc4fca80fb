"""Torch modules of the four components, with the contract's BC1S inputs and outputs.

Two internal layouts compute the same function:

- ``"ane"`` (Core ML): tensors are (batch, channels, 1, sequence) throughout; LayerNorm normalizes the channel
  axis and projections are 1x1 convolutions, the form the Neural Engine runs best.
- ``"btc"`` (ONNX): the residual stream is (batch, sequence, channels) and projections are plain ``MatMul``s
  with a constant right operand, the form ONNX Runtime's fused kernels and weight quantization
  (``MatMulNBits``) take. Only the component boundaries (caches, encoder outputs) are BC1S.

In both, the key projections carry no bias, the output projection reuses the token embedding, and the conv
stem runs as Conv2d on [B, M, 1, T]. Attention is computed by an interchangeable implementation
(:data:`SDPA_IMPLEMENTATIONS`) chosen per component with one argument; the encoder may also take ONNX Runtime's
fused operator (``"mha"``, :func:`self_attention`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..audio import HOP_LENGTH, N_FFT
from ..contract import LOGIT_POSITIONS, LOGPROB_POSITIONS, LOGPROB_TOKENS, MASK_VALUE
from ..dims import ModelDimensions
from .attention import SDPA_IMPLEMENTATIONS, sdpa_cached, self_attention
from .layers import (
    KEEP,
    MLP,
    CrossAttentionProj,
    SelfAttentionProj,
    TextLogprobs,
    conv_weight,
    from_bc1s,
    heads,
    layer_norm,
    load_attention,
    load_layer_norm,
    load_mlp,
    projection,
    reshape,
    rows_from,
    set_weight,
    split_heads,
    tail_start,
    to_bc1s,
    unheads,
)
from .mel import mel_filters

# --- MelSpectrogram -------------------------------------------------------------------------------------


class MelSpectrogram(nn.Module):
    """audio [480000] -> log-mel [1, M, 1, 3000], as openai-whisper's log_mel_spectrogram.

    The STFT is a strided Conv1d over a windowed DFT basis, which exports to every target.
    """

    def __init__(self, n_mels: int):
        super().__init__()
        n_bins = N_FFT // 2 + 1
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
        freqs = np.arange(n_bins)[:, None] * np.arange(N_FFT)[None, :] * 2 * np.pi / N_FFT
        basis = np.concatenate([np.cos(freqs) * window, -np.sin(freqs) * window], axis=0)
        self.register_buffer("dft_basis", torch.from_numpy(basis.astype(np.float32))[:, None, :])
        self.register_buffer("mel_filters", torch.from_numpy(mel_filters(n_mels)))
        self.n_bins = n_bins

    def forward(self, audio: Tensor) -> Tensor:
        x = F.pad(audio.reshape(1, 1, -1), (N_FFT // 2, N_FFT // 2), mode="reflect")
        spec = F.conv1d(x, self.dft_basis, stride=HOP_LENGTH)[:, :, :-1]  # drop the last frame
        real, imag = spec[:, : self.n_bins], spec[:, self.n_bins :]
        power = real * real + imag * imag  # [1, 201, 3000]
        mel = torch.matmul(self.mel_filters, power)  # [1, M, 3000]
        log_spec = torch.clamp(mel, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return ((log_spec + 4.0) / 4.0).unsqueeze(2)


# --- AudioEncoder ---------------------------------------------------------------------------------------


class EncoderBlock(nn.Module):
    def __init__(self, d: int, n_head: int, sdpa: str, layout: str):
        super().__init__()
        self.attn = SelfAttentionProj(d, layout)
        self.attn_ln = layer_norm(d, layout)
        self.mlp = MLP(d, layout)
        self.mlp_ln = layer_norm(d, layout)
        self.n_head = n_head
        self.layout = layout
        self.use_attention(sdpa)

    def use_attention(self, sdpa: str) -> None:
        self.sdpa = sdpa
        self.attention = self_attention(sdpa, self.n_head, self.layout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.attn_ln(x)
        q, k, v = (p(h) for p in (self.attn.query, self.attn.key, self.attn.value))
        x = x + self.attn.out(self.attention(q, k, v))
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    """mel [B, M, 1, 3000] -> (encoder_output_embeds [B, d, 1, F], cross K cache, cross V cache [B, d*L, 1, F])."""

    def __init__(self, dims: ModelDimensions, sdpa: str = "chunked", layout: str = "ane"):
        super().__init__()
        d = dims.n_audio_state
        self.layout = layout
        self.conv1 = nn.Conv2d(dims.n_mels, d, kernel_size=(1, 3), padding=(0, 1))
        self.conv2 = nn.Conv2d(d, d, kernel_size=(1, 3), stride=(1, 2), padding=(0, 1))
        self.register_buffer("positional_embedding", torch.zeros(d, dims.n_audio_ctx))
        self.blocks = nn.ModuleList(EncoderBlock(d, dims.n_audio_head, sdpa, layout) for _ in range(dims.n_audio_layer))
        self.ln_post = layer_norm(d, layout)
        # The decoder's cross-attention key/value projections, computed once per window here.
        self.cross_key = nn.ModuleList(projection(d, dims.n_text_state, layout, bias=False) for _ in range(dims.n_text_layer))
        self.cross_value = nn.ModuleList(projection(d, dims.n_text_state, layout) for _ in range(dims.n_text_layer))

    def hidden_states(self, mel: Tensor) -> Tensor:
        """The encoder output in this layout (before the cross-attention projections)."""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x))
        x = from_bc1s(x + self.positional_embedding.unsqueeze(0).unsqueeze(2), self.layout)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)

    def forward(self, mel: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self.hidden_states(mel)
        channels = 1 if self.layout == "ane" else 2  # concatenated layer-major on the channel axis
        k = torch.cat([p(x) for p in self.cross_key], dim=channels)
        v = torch.cat([p(x) for p in self.cross_value], dim=channels)
        return to_bc1s(x, self.layout), to_bc1s(k, self.layout), to_bc1s(v, self.layout)


@contextlib.contextmanager
def attention(encoder: AudioEncoder, sdpa: str) -> Iterator[AudioEncoder]:
    """``encoder`` computing its attention another way (:func:`self_attention`) for a while, on the same weights
    (a second encoder built for it would hold a second copy of them)."""
    saved = [block.sdpa for block in encoder.blocks]
    for block in encoder.blocks:
        block.use_attention(sdpa)
    try:
        yield encoder
    finally:
        for block, name in zip(encoder.blocks, saved, strict=True):
            block.use_attention(name)


class PerLayerOutputs(nn.Module):
    """An encoder whose cross K/V come as one output per layer (for ONNX Runtime), in BC1S:
    ``encoder_output_embeds``, L cross keys, L cross values.

    Concatenating the layers' projections makes the encoder's peak memory the pieces plus the concatenation
    (for base: 2 x 37 MB, the largest activation of the whole run); per-layer outputs are the pieces alone, and
    the decoder takes them as per-layer inputs (:class:`PerLayerInputs`).
    """

    def __init__(self, encoder: AudioEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, mel: Tensor) -> tuple[Tensor, ...]:
        enc = self.encoder
        x = enc.hidden_states(mel)
        keys = [to_bc1s(p(x), enc.layout) for p in enc.cross_key]
        values = [to_bc1s(p(x), enc.layout) for p in enc.cross_value]
        return (to_bc1s(x, enc.layout), *keys, *values)


# --- TextDecoder ----------------------------------------------------------------------------------------


class DecoderBlock(nn.Module):
    def __init__(self, d: int, n_head: int, layout: str):
        super().__init__()
        self.attn = SelfAttentionProj(d, layout)
        self.attn_ln = layer_norm(d, layout)
        self.cross_attn = CrossAttentionProj(d, layout)
        self.cross_attn_ln = layer_norm(d, layout)
        self.mlp = MLP(d, layout)
        self.mlp_ln = layer_norm(d, layout)
        self.n_head = n_head


class TextDecoderBase(nn.Module):
    """``text_vocab``: the ids below <|endoftext|>, over which openai normalises the word probabilities of the
    alignment pass (default: the whole vocabulary)."""

    def __init__(self, dims: ModelDimensions, alignment_heads: list[tuple[int, int]], sdpa: str = "einsum",
                 layout: str = "ane", text_vocab: int | None = None):
        super().__init__()
        d = dims.n_text_state
        self.dims = dims
        self.layout = layout
        self.text_vocab = text_vocab or dims.n_vocab
        self.token_embedding = nn.Embedding(dims.n_vocab, d)
        self.positional_embedding = nn.Parameter(torch.zeros(dims.n_text_ctx, d))
        self.blocks = nn.ModuleList(DecoderBlock(d, dims.n_text_head, layout) for _ in range(dims.n_text_layer))
        self.ln = layer_norm(d, layout)
        self.alignment_heads = [tuple(h) for h in alignment_heads]
        self.sdpa = SDPA_IMPLEMENTATIONS[sdpa]

    def layer_slice(self, cache: Tensor | list[Tensor], layer: int) -> Tensor:
        """Layer ``layer`` of a cache: a slice of the concatenated [B, d*L, 1, T], or one of per-layer inputs."""
        if isinstance(cache, (list, tuple)):
            return cache[layer]
        d = self.dims.n_text_state
        return cache[:, layer * d : (layer + 1) * d]

    def run_blocks(
        self, x: Tensor, self_attention, enc_k: Tensor, enc_v: Tensor, tail_from: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor], list[Tensor], list[Tensor]]:
        """x [B, T, d] in this layout. ``self_attention(layer, q, k, v, first)`` takes the queries [B, H, Dh, Tq]
        and the new tokens' K/V in BC1S and returns the attention output [B, H, Dh, Tq] over whatever the layer
        attends to (a cache and the new tokens); the new K/V are returned in BC1S for the cache. With ``tail_from``
        (``tail_start``), the last layer's queries, cross-attention and MLP run on the rows from there on
        (``first``; None in the other layers): its alignment weights [B, A_i, Tq, F] have those rows alone."""
        lay = self.layout
        last = len(self.blocks) - 1
        new_k, new_v, align = [], [], []
        for i, block in enumerate(self.blocks):
            h = block.attn_ln(x)
            k, v = to_bc1s(block.attn.key(h), lay), to_bc1s(block.attn.value(h), lay)
            new_k.append(k)
            new_v.append(v)
            first = tail_from if i == last else None
            if first is not None:  # a prompt's tail, read by nothing, is not computed
                x, h = rows_from(x, first, self.time_axis), rows_from(h, first, self.time_axis)
            q = heads(block.attn.query(h), block.n_head, lay)
            x = x + block.attn.out(unheads(self_attention(i, q, k, v, first), lay))
            h = block.cross_attn_ln(x)
            q = heads(block.cross_attn.query(h), block.n_head, lay)
            ek = split_heads(self.layer_slice(enc_k, i), block.n_head)
            ev = split_heads(self.layer_slice(enc_v, i), block.n_head)
            o, w = self.sdpa(q, ek, ev, None)  # w [B, H, Tq, F]
            layer_heads = [head for layer, head in self.alignment_heads if layer == i]
            if layer_heads:  # one Gather of this layer's heads, not one Gather and Unsqueeze a head
                align.append(w[:, layer_heads])  # [B, A_i, Tq, F]
            x = x + block.cross_attn.out(unheads(o, lay))
            x = x + block.mlp(block.mlp_ln(x))
        return self.ln(x), new_k, new_v, align

    @property
    def time_axis(self) -> int:
        """The token axis of an activation in this layout: [B, T, d] or BC1S [B, d, 1, T]."""
        return 3 if self.layout == "ane" else 1

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Self-attention of queries [B, H, Dh, T] over keys/values in BC1S, with an additive mask."""
        n_head = self.dims.n_text_head
        return self.sdpa(q, split_heads(k, n_head), split_heads(v, n_head), mask)[0]

    def embed(self, x: Tensor) -> Tensor:
        """Token + position embeddings [B, T, d] -> this layout."""
        return to_bc1s(x, "btc") if self.layout == "ane" else x

    def logits(self, x: Tensor) -> Tensor:
        """x in this layout -> [B, T, V] with the tied embedding.

        A 2-D ``linear`` exports as Gemm(transB=1) on the embedding initializer itself: a 3-D matmul against
        ``weight.t()`` would be constant-folded into a second, transposed copy of the largest tensor.
        """
        x = from_bc1s(x, "btc") if self.layout == "ane" else x  # [B, T, d]
        return F.linear(x.reshape(-1, x.shape[2]), self.token_embedding.weight).reshape(x.shape[0], -1, self.dims.n_vocab)

    def logits_and_logprobs(self, x: Tensor, logit_positions: Tensor, logprob_positions: Tensor,
                            logprob_tokens: Tensor) -> tuple[Tensor, Tensor]:
        """x in this layout -> (logits [(P + Q) * B, V], token log-probabilities [B, Q]) from one vocabulary
        projection (one weight for the int8 graph to prepack) of the positions ``logit_positions`` [P], then
        ``logprob_positions`` [Q], position-major: row ``p * B + b`` is row b's position p. The first P * B
        rows are the logits asked for (the graph's output as the projection wrote it: no copy); the log-
        probabilities are those of ``logprob_tokens`` [B, Q] under the text vocabulary (``TextLogprobs``).
        The alignment pass needs one number a token, not its [Q, V] logits, which cost more to copy out of
        the graph and normalise on the host than to project."""
        x = from_bc1s(x, "btc") if self.layout == "ane" else x  # [B, T, d]
        positions = torch.cat([logit_positions, logprob_positions]).long()
        rows = x.index_select(1, positions).transpose(0, 1).reshape(-1, int(x.shape[2]))  # [(P + Q) * B, d]
        logits = F.linear(rows, self.token_embedding.weight)
        tokens = logprob_tokens.long().t().reshape(-1, 1)  # [Q * B, 1], position-major
        logprobs = TextLogprobs.apply(logits, tokens, self.text_vocab)  # [Q * B, 1]
        return logits, logprobs.reshape(logprob_tokens.shape[1], logprob_tokens.shape[0]).t()


class TextDecoder(TextDecoderBase):
    """One token per call over a fixed-length cache of S positions (one-hot update mask)."""

    def forward(
        self,
        input_ids: Tensor,  # [B] int32
        cache_length: Tensor,  # [B] int32
        key_cache: Tensor,  # [B, d*L, 1, S]
        value_cache: Tensor,
        kv_cache_update_mask: Tensor,  # [B, S]
        decoder_key_padding_mask: Tensor,  # [B, S]
        encoder_attn_key_cache: Tensor | list[Tensor],  # [1 or B, d*L, 1, F], or L tensors [1 or B, d, 1, F]
        encoder_attn_value_cache: Tensor | list[Tensor],
    ):
        x = self.token_embedding(input_ids.long()) + self.positional_embedding[cache_length.long()]
        x = self.embed(x.unsqueeze(1))
        upd = kv_cache_update_mask.unsqueeze(1).unsqueeze(2)  # [B, 1, 1, S]
        keep = 1.0 - upd

        mask = decoder_key_padding_mask.unsqueeze(1).unsqueeze(2)  # [B, 1, 1, S]

        def self_attention(i: int, q: Tensor, k: Tensor, v: Tensor, first: None) -> Tensor:  # noqa: ARG001
            k_all = self.layer_slice(key_cache, i) * keep + k * upd
            v_all = self.layer_slice(value_cache, i) * keep + v * upd
            return self.attend(q, k_all, v_all, mask)

        x, new_k, new_v, align = self.run_blocks(x, self_attention, encoder_attn_key_cache, encoder_attn_value_cache)
        logits = self.logits(x)  # [B, 1, V]
        weights = torch.cat(align, dim=1)[:, :, 0]  # [B, A, 1, F] -> [B, A, F]
        return logits, torch.cat(new_k, dim=1), torch.cat(new_v, dim=1), weights


class TextDecoderSequence(TextDecoderBase):
    """T tokens in one call (prompts, exact prefill, the teacher-forced alignment pass).

    Attends over the S cached positions (``decoder_key_padding_mask``) and causally within the T new ones;
    returns the T new cache columns for the host to write at ``cache_length``, the logits of the positions
    asked for and the text-vocabulary log-probabilities of the tokens asked for (``logits_and_logprobs``).
    """

    def forward(
        self,
        input_ids: Tensor,  # [B, T] int32
        cache_length: Tensor,  # [B] int32: position of the first new token
        key_cache: Tensor,
        value_cache: Tensor,
        decoder_key_padding_mask: Tensor,  # [B, S]
        encoder_attn_key_cache: Tensor | list[Tensor],
        encoder_attn_value_cache: Tensor | list[Tensor],
        logit_positions: Tensor | None = None,  # [P] int32: the positions whose logits are wanted (all if None)
        logprob_positions: Tensor | None = None,  # [Q] int32: positions whose next token's log-probability is read
        logprob_tokens: Tensor | None = None,  # [B, Q] int32: that next token, per row (none if None)
    ):
        t = input_ids.shape[1]
        if logit_positions is None:
            logit_positions = torch.arange(t, dtype=torch.int32)
        if logprob_positions is None:
            logprob_positions = torch.zeros(0, dtype=torch.int32)
            logprob_tokens = torch.zeros(input_ids.shape[0], 0, dtype=torch.int32)
        steps = torch.arange(t, device=input_ids.device).unsqueeze(0)
        pos = cache_length.long().unsqueeze(1) + steps  # [B, T]
        x = self.embed(self.token_embedding(input_ids.long()) + self.positional_embedding[pos])
        causal = torch.triu(torch.full((t, t), MASK_VALUE, dtype=x.dtype), diagonal=1)  # [T, T]
        pad = decoder_key_padding_mask.unsqueeze(1).unsqueeze(2)  # [B, 1, 1, S]

        def self_attention(i: int, q: Tensor, k: Tensor, v: Tensor, first: Tensor | None) -> Tensor:
            n_head = self.dims.n_text_head
            cached = (split_heads(self.layer_slice(key_cache, i), n_head), split_heads(self.layer_slice(value_cache, i), n_head), pad)
            mask = causal if first is None else rows_from(causal, first, 0)  # the query rows' own
            return sdpa_cached(q, cached, (split_heads(k, n_head), split_heads(v, n_head), mask))

        first = tail_start(input_ids, torch.cat([logit_positions, logprob_positions]))
        x, new_k, new_v, align = self.run_blocks(x, self_attention, encoder_attn_key_cache, encoder_attn_value_cache, first)
        # Each layer's heads as a block of rows, [B, sum A_i * T_i, F]: a prompt's last layer has no rows, the
        # others T; a call that reads the weights (first = 0) gives [B, A, T, F] in this memory order (the host's
        # reshape, ``runtime.decoder_adapters.SequenceGraph.alignment``). Gathering the other layers' rows to match
        # the last layer's would add nodes to every one-token step, and slicing them after their Gather would raise
        # the peak.
        frames = int(align[0].shape[3])
        weights = torch.cat([reshape(a, KEEP, -1, frames) for a in align], dim=1)
        # ONNX Runtime runs every node whatever outputs are asked for: a prompt's vocabulary projection, which
        # nothing reads, would be much of the call.
        logits, logprobs = self.logits_and_logprobs(x, logit_positions, logprob_positions, logprob_tokens)
        return logits, torch.cat(new_k, dim=1), torch.cat(new_v, dim=1), weights, logprobs


# TextDecoderSequence's last inputs: which positions get logits, which get token log-probabilities, and the tokens
SEQUENCE_SELECTORS = (LOGIT_POSITIONS, LOGPROB_POSITIONS, LOGPROB_TOKENS)


class PerLayerInputs(nn.Module):
    """A decoder whose caches come as one input per layer (for ONNX Runtime).

    ONNX has no views: slicing the concatenated [B, d*L, 1, F] cross caches and [B, d*L, 1, S] self caches
    copies all of them on every step (24 MB a token for tiny.en). Per-layer inputs are views of the host's
    arrays, passed without a copy. Inputs: ``input_ids``, ``cache_length``, L key caches, L value caches, the
    decoder's masks, L cross keys, L cross values, then the positions and tokens asked for
    (``SEQUENCE_SELECTORS`` of them); outputs unchanged (the updates stay concatenated).
    """

    def __init__(self, decoder: TextDecoderBase):
        super().__init__()
        self.decoder = decoder
        self.n_layer = decoder.dims.n_text_layer

    def forward(self, *inputs: Tensor):
        n = self.n_layer
        ids, length = inputs[:2]
        keys, values = list(inputs[2 : 2 + n]), list(inputs[2 + n : 2 + 2 * n])
        k = len(SEQUENCE_SELECTORS)
        masks, cross, selectors = inputs[2 + 2 * n : -2 * n - k], inputs[-2 * n - k : -k], inputs[-k:]
        return self.decoder(ids, length, keys, values, *masks, list(cross[:n]), list(cross[n:]), *selectors)


# --- TextDecoderContextPrefill --------------------------------------------------------------------------


class TextDecoderContextPrefill(nn.Module):
    """(task, language) -> K/V of the forced prefix positions, looked up from a precomputed table.

    ``key_table``/``value_table``: [n_tasks, n_languages, d*L, P]. ``language`` is the token id of ``<|xx|>``;
    ``language_offset`` maps it to a row (0 for English-only models, whose table has one language row).
    """

    def __init__(self, key_table: np.ndarray, value_table: np.ndarray, language_offset: int, n_languages: int):
        super().__init__()
        self.register_buffer("key_table", torch.from_numpy(key_table.astype(np.float32)))
        self.register_buffer("value_table", torch.from_numpy(value_table.astype(np.float32)))
        self.language_offset = language_offset
        self.n_languages = n_languages

    def forward(self, task: Tensor, language: Tensor) -> tuple[Tensor, Tensor]:
        t = task.long().clamp(0, self.key_table.shape[0] - 1)
        lang = (language.long() - self.language_offset).clamp(0, self.n_languages - 1)
        k = self.key_table[t, lang]  # [1, d*L, P]
        v = self.value_table[t, lang]
        return k.unsqueeze(2), v.unsqueeze(2)


def build_encoder(ckpt, sdpa: str = "chunked", layout: str = "ane") -> AudioEncoder:
    sd, dims = ckpt.state_dict, ckpt.dims
    enc = AudioEncoder(dims, sdpa, layout)
    for conv in ("conv1", "conv2"):
        getattr(enc, conv).weight.data = conv_weight(sd[f"encoder.{conv}.weight"])
        getattr(enc, conv).bias.data = torch.from_numpy(sd[f"encoder.{conv}.bias"].astype(np.float32))
    enc.positional_embedding.data = torch.from_numpy(sd["encoder.positional_embedding"].T.astype(np.float32).copy())
    for i, b in enumerate(enc.blocks):
        load_attention(b.attn, sd, f"encoder.blocks.{i}.attn")
        load_layer_norm(b.attn_ln, sd, f"encoder.blocks.{i}.attn_ln")
        load_mlp(b.mlp, sd, f"encoder.blocks.{i}.mlp")
        load_layer_norm(b.mlp_ln, sd, f"encoder.blocks.{i}.mlp_ln")
    load_layer_norm(enc.ln_post, sd, "encoder.ln_post")
    for i in range(dims.n_text_layer):
        set_weight(enc.cross_key[i], sd[f"decoder.blocks.{i}.cross_attn.key.weight"])
        set_weight(enc.cross_value[i], sd[f"decoder.blocks.{i}.cross_attn.value.weight"])
        enc.cross_value[i].bias.data = torch.from_numpy(sd[f"decoder.blocks.{i}.cross_attn.value.bias"].astype(np.float32))
    return enc.eval()


def build_decoder(ckpt, cls=TextDecoder, sdpa: str = "einsum", layout: str = "ane",
                  text_vocab: int | None = None) -> TextDecoderBase:
    sd, dims = ckpt.state_dict, ckpt.dims
    dec = cls(dims, ckpt.alignment_heads, sdpa, layout, text_vocab)
    dec.token_embedding.weight.data = torch.from_numpy(sd["decoder.token_embedding.weight"].astype(np.float32))
    dec.positional_embedding.data = torch.from_numpy(sd["decoder.positional_embedding"].astype(np.float32))
    for i, b in enumerate(dec.blocks):
        p = f"decoder.blocks.{i}"
        load_attention(b.attn, sd, f"{p}.attn")
        load_layer_norm(b.attn_ln, sd, f"{p}.attn_ln")
        load_attention(b.cross_attn, sd, f"{p}.cross_attn", names=("query", "out"))
        load_layer_norm(b.cross_attn_ln, sd, f"{p}.cross_attn_ln")
        load_mlp(b.mlp, sd, f"{p}.mlp")
        load_layer_norm(b.mlp_ln, sd, f"{p}.mlp_ln")
    load_layer_norm(dec.ln, sd, "decoder.ln")
    return dec.eval()
