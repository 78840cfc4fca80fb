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
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..audio import HOP_LENGTH, N_FFT, mel_filters
from ..bundle import MASK_VALUE
from ..dims import ModelDimensions

# --- attention implementations --------------------------------------------------------------------------
# q: [B, H, Dh, Tq], k/v: [B', H, Dh, Tk] with B' == B or 1 (broadcast), mask: additive, broadcastable to
# [B, H, Tq, Tk]. Return (out [B, H, Dh, Tq], weights [B, H, Tq, Tk] softmaxed).


def head_scale(q: Tensor) -> float:
    """1 / sqrt(Dh) as a constant: ``q.shape[2] ** -0.5`` would be traced into a Shape/Gather/Cast/Pow chain that
    ONNX Runtime runs on every call."""
    return float(int(q.shape[2]) ** -0.5)


def sdpa_einsum(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """One batched product each way: the compact form for the one-token decoder."""
    scores = torch.matmul((q * head_scale(q)).transpose(2, 3), k)  # [B, H, Tq, Tk]; scaling q is Tk/Dh times cheaper
    if mask is not None:
        scores = scores + mask
    w = scores.softmax(dim=-1)
    return weighted_values(w, v), w


def weighted_values(w: Tensor, v: Tensor) -> Tensor:
    """Attention weights [B, H, Tq, Tk] applied to values [B', H, Dh, Tk] -> [B, H, Dh, Tq].

    Computed as w @ v^T, transposed after: ``v @ w^T`` becomes ONNX Runtime's FusedMatMul(v, w, transB), whose
    CPU kernel packs w for a product of one column when Tq = 1 (the one-token step): 2.6x the time of this form
    for one row, 2.1x at 8 rows (tiny.en's 1500-frame cross values, per layer); w @ v^T is faster at Tq = 97-224
    as well (0.45 against 0.59 ms, 0.95 against 1.12 ms)."""
    return torch.matmul(w, v.transpose(2, 3)).transpose(2, 3)


def sdpa_cached(q: Tensor, cached: tuple[Tensor, Tensor, Tensor], new: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """Attention over a cache and the new positions without concatenating them: ``cached`` and ``new`` are
    (k, v, additive mask) each; the scores of both parts share one softmax. A concatenated [cache | new] K/V
    would copy the whole fixed-length cache on every call (tiny.en at 8 rows: 44 MB a step)."""
    (kc, vc, mc), (kn, vn, mn) = cached, new
    qs = (q * head_scale(q)).transpose(2, 3)  # [B, H, T, Dh]
    w = torch.cat([torch.matmul(qs, kc) + mc, torch.matmul(qs, kn) + mn], dim=3).softmax(dim=-1)
    # The cache's length, read off its mask (the same tensor in every layer, so ONNX Runtime computes it once);
    # a call on an empty state passes no cache positions at all.
    s = mc.shape[3]
    wc, wn = w[..., :s], w[..., s:]
    return weighted_values(wc, vc) + weighted_values(wn, vn)  # [B, H, Dh, T]


def sdpa_split_heads(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """One product per head (ml-ane-transformers' split-einsum form): keeps every tensor rank-3 for the ANE."""
    scale = head_scale(q)
    outs, ws = [], []
    for h in range(q.shape[1]):
        s = torch.einsum("bdq,bdk->bqk", q[:, h], k[:, h]) * scale
        if mask is not None:
            s = s + (mask[:, 0] if mask.dim() == 4 else mask)
        w = s.softmax(dim=-1)
        outs.append(torch.einsum("bqk,bdk->bdq", w, v[:, h]))
        ws.append(w)
    return torch.stack(outs, dim=1), torch.stack(ws, dim=1)


def sdpa_chunked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, chunk: int = 500) -> tuple[Tensor, Tensor]:
    """Queries in blocks: bounds the score matrix of the 1500-frame encoder to chunk x 1500."""
    outs, ws = [], []
    for start in range(0, q.shape[3], chunk):
        m = None if mask is None else mask[..., start : start + chunk, :] if mask.shape[-2] > 1 else mask
        o, w = sdpa_einsum(q[..., start : start + chunk], k, v, m)
        outs.append(o)
        ws.append(w)
    return torch.cat(outs, dim=3), torch.cat(ws, dim=2)


def sdpa_fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, None]:
    """torch's fused attention, no weights: for computing with the encoder in torch (the prefill table's noise
    windows: 4x the chunked form's speed), not for export."""
    out = F.scaled_dot_product_attention(q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3), attn_mask=mask)
    return out.transpose(2, 3), None


class _MultiHeadAttention(torch.autograd.Function):
    """q, k, v [B, T, H * Dh] -> [B, T, H * Dh]: torch's fused attention when run, ONNX Runtime's
    ``com.microsoft::MultiHeadAttention`` when exported."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, n_head: int) -> Tensor:  # noqa: ARG004
        b, t, d = q.shape
        split = lambda x: x.reshape(b, x.shape[1], n_head, d // n_head).transpose(1, 2)  # noqa: E731
        return F.scaled_dot_product_attention(split(q), split(k), split(v)).transpose(1, 2).reshape(b, t, d)

    @staticmethod
    def symbolic(g, q, k, v, n_head: int):
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, num_heads_i=n_head)
        out.setType(q.type())
        return out


SDPA_IMPLEMENTATIONS = {"einsum": sdpa_einsum, "split_heads": sdpa_split_heads, "chunked": sdpa_chunked,
                        "fused": sdpa_fused}  # fmt: skip


def self_attention(sdpa: str, n_head: int, layout: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Self-attention as a function of the q, k, v projections in ``layout`` (the encoder's), output in ``layout``:
    one of SDPA_IMPLEMENTATIONS between the head split and merge, or (``"mha"``, BTC only) ONNX Runtime's
    MultiHeadAttention on the projections as they are, exported as one node. Its CPU kernel keeps the
    [H, 1500, 1500] scores out of memory; the chunked MatMul/Softmax/MatMul form took ~1.8x as long per layer
    (int8 encoder a window, best of 7: tiny.en 613 -> 419 ms, base 1201 -> 993 ms), and head reshapes around
    the operator were traced into shape arithmetic that cost ~100 ms a window (tiny.en)."""
    if sdpa == "mha":
        if layout == "ane":
            raise ValueError("mha is ONNX Runtime's operator, for the BTC layout")
        return lambda q, k, v: _MultiHeadAttention.apply(q, k, v, n_head)
    fn = SDPA_IMPLEMENTATIONS[sdpa]

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        o, _ = fn(*(heads(t, n_head, layout) for t in (q, k, v)), None)
        return unheads(o, layout)

    return attend


# --- building blocks ------------------------------------------------------------------------------------


class LayerNormANE(nn.Module):
    """LayerNorm over the channel axis of a BC1S tensor."""

    def __init__(self, n: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=1, keepdim=True)
        return xc * torch.rsqrt(var + self.eps) * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


def projection(n_in: int, n_out: int, layout: str, bias: bool = True) -> nn.Module:
    """A dense projection of the channel axis: a 1x1 Conv2d on BC1S, a Linear on BTC."""
    if layout == "ane":
        return nn.Conv2d(n_in, n_out, kernel_size=1, bias=bias)
    return nn.Linear(n_in, n_out, bias=bias)


def layer_norm(n: int, layout: str) -> nn.Module:
    return LayerNormANE(n) if layout == "ane" else nn.LayerNorm(n)


KEEP = 0  # in a ``reshape`` target: this dimension as the input has it (ONNX Reshape's 0)
INT64_MAX = torch.iinfo(torch.int64).max  # a Slice's "to the end"


def int64_constant(g, value: int | tuple[int, ...] | list[int]):
    """An ONNX Constant in a ``symbolic``: a scalar for an int, 1-D for a sequence."""
    return g.op("Constant", value_t=torch.tensor(value, dtype=torch.int64))


def _kept(x: Tensor, shape: tuple[int, ...]) -> list[int]:
    return [x.shape[i] if n == KEEP else n for i, n in enumerate(shape)]


class _Reshape(torch.autograd.Function):
    """``x`` to ``shape``, where KEEP takes the input's size at that index: exported as one Reshape with a
    constant target. ``x.reshape(x.shape[0], ...)`` is traced into Shape/Gather/Unsqueeze/Concat chains that ONNX
    Runtime runs on every call where the batch or token count is dynamic (214 of the one-token step's 392 nodes)."""

    @staticmethod
    def forward(ctx, x: Tensor, shape: tuple[int, ...]) -> Tensor:  # noqa: ARG004
        return x.reshape(_kept(x, shape))

    @staticmethod
    def symbolic(g, x, shape: tuple[int, ...]):
        return g.op("Reshape", x, int64_constant(g, shape))


def reshape(x: Tensor, *shape: int) -> Tensor:
    """``x.reshape(shape)`` with KEEP for the input's own size at that index; a constant-target Reshape in ONNX
    export, a plain reshape elsewhere (torch, Core ML's traced graphs)."""
    return _Reshape.apply(x, shape) if torch.onnx.is_in_onnx_export() else x.reshape(_kept(x, shape))


def split_heads(x: Tensor, n_head: int) -> Tensor:
    """BC1S [B, d, 1, T] -> [B, H, Dh, T] (caches and ane-layout activations). T is the inferred size: it may be
    0 (an empty cache), from which ONNX Runtime cannot infer Dh."""
    return reshape(x, KEEP, n_head, int(x.shape[1]) // n_head, -1)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, Dh, T] -> BC1S [B, H * Dh, 1, T]."""
    return reshape(x, KEEP, -1, 1, KEEP)


def to_bc1s(x: Tensor, layout: str) -> Tensor:
    """An activation in ``layout`` -> BC1S [B, d, 1, T] (the contract's form at component boundaries)."""
    return x if layout == "ane" else x.transpose(1, 2).unsqueeze(2)


def from_bc1s(x: Tensor, layout: str) -> Tensor:
    return x if layout == "ane" else x.squeeze(2).transpose(1, 2)


def heads(x: Tensor, n_head: int, layout: str) -> Tensor:
    """An activation in ``layout`` -> [B, H, Dh, T], the form every SDPA implementation takes. T is the inferred
    size: a prompt's last layer runs its queries on no rows (``tail_start``)."""
    if layout == "ane":
        return split_heads(x, n_head)
    return reshape(x, KEEP, -1, n_head, int(x.shape[2]) // n_head).permute(0, 2, 3, 1)


def unheads(o: Tensor, layout: str) -> Tensor:
    """[B, H, Dh, T] -> an activation in ``layout``; T inferred, as in ``heads``."""
    if layout == "ane":
        return merge_heads(o)
    return reshape(o.permute(0, 3, 1, 2), KEEP, -1, int(o.shape[1]) * int(o.shape[2]))


class _TailStart(torch.autograd.Function):
    """The first of a call's T rows that the last layer's attention and MLP run on ([1] int64): 0 where the call
    reads any position's logits or log-probabilities (``positions``), T where it reads none (a prompt, whose only
    use is the K/V it leaves in the cache: the last layer's come from its key and value projections alone)."""

    @staticmethod
    def forward(ctx, input_ids: Tensor, positions: Tensor) -> Tensor:  # noqa: ARG004
        # tensor operations only: the exporter traces this forward too
        tokens = torch.ones_like(input_ids[0, :1], dtype=torch.int64) * input_ids.shape[1]
        return (1 - torch.ones_like(positions[:1], dtype=torch.int64).sum()) * tokens

    @staticmethod
    def symbolic(g, input_ids, positions):
        tokens = g.op("Gather", g.op("Shape", input_ids), int64_constant(g, [1]), axis_i=0)
        unread = g.op("Cast", g.op("Equal", g.op("Size", positions), int64_constant(g, 0)), to_i=7)  # 7: INT64
        return g.op("Mul", tokens, unread)


class _RowsFrom(torch.autograd.Function):
    """``x`` from index ``first`` ([1] int64, a tensor) on along ``axis``: one Slice."""

    @staticmethod
    def forward(ctx, x: Tensor, first: Tensor, axis: int) -> Tensor:  # noqa: ARG004
        rows = torch.arange(x.shape[axis])  # tensor operations only, no int(first): the exporter traces this forward
        return x.index_select(axis, rows[rows >= first])

    @staticmethod
    def symbolic(g, x, first, axis: int):
        return g.op("Slice", x, first, int64_constant(g, [INT64_MAX]), int64_constant(g, [axis]))


def tail_start(input_ids: Tensor, positions: Tensor) -> Tensor:
    return _TailStart.apply(input_ids, positions)


def rows_from(x: Tensor, first: Tensor, axis: int) -> Tensor:
    return _RowsFrom.apply(x, first, axis)


class MLP(nn.Module):
    def __init__(self, d: int, layout: str):
        super().__init__()
        self.fc1 = projection(d, 4 * d, layout)
        self.fc2 = projection(4 * d, d, layout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttentionProj(nn.Module):
    def __init__(self, d: int, layout: str):
        super().__init__()
        self.query = projection(d, d, layout)
        self.key = projection(d, d, layout, bias=False)
        self.value = projection(d, d, layout)
        self.out = projection(d, d, layout)


class CrossAttentionProj(nn.Module):
    """Decoder side of cross attention: the key/value projections live in the encoder (see AudioEncoder)."""

    def __init__(self, d: int, layout: str):
        super().__init__()
        self.query = projection(d, d, layout)
        self.out = projection(d, d, layout)


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
                 layout: str = "ane", text_vocab: int | None = None):  # fmt: skip
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
            if first is not None:  # a prompt's tail, read by nothing: 22 % of the call (tiny.en, 217 tokens), 18 % (base)
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
                            logprob_tokens: Tensor) -> tuple[Tensor, Tensor]:  # fmt: skip
        """x in this layout -> (logits [(P + Q) * B, V], token log-probabilities [B, Q]) from one vocabulary
        projection (one weight for the int8 graph to prepack) of the positions ``logit_positions`` [P], then
        ``logprob_positions`` [Q], position-major: row ``p * B + b`` is row b's position p. The first P * B
        rows are the logits asked for (the graph's output as the projection wrote it: no copy); the log-
        probabilities are those of ``logprob_tokens`` [B, Q] under the text vocabulary (``_TextLogprobs``).
        The alignment pass needs one number a token, not its [Q, V] logits, which cost more to copy out of
        the graph and normalise on the host than to project."""
        x = from_bc1s(x, "btc") if self.layout == "ane" else x  # [B, T, d]
        positions = torch.cat([logit_positions, logprob_positions]).long()
        rows = x.index_select(1, positions).transpose(0, 1).reshape(-1, int(x.shape[2]))  # [(P + Q) * B, d]
        logits = F.linear(rows, self.token_embedding.weight)
        tokens = logprob_tokens.long().t().reshape(-1, 1)  # [Q * B, 1], position-major
        logprobs = _TextLogprobs.apply(logits, tokens, self.text_vocab)  # [Q * B, 1]
        return logits, logprobs.reshape(logprob_tokens.shape[1], logprob_tokens.shape[0]).t()


def sum_blocks(n: int, longest: int = 4096) -> tuple[int, int]:
    """(blocks, block length) of a sum of n terms: the longest block of at most ``longest`` that divides n."""
    length = max(d for d in range(1, min(n, longest) + 1) if n % d == 0)
    return n // length, length


class _TextLogprobs(torch.autograd.Function):
    """logits [N, V] and tokens [M, 1] -> [M, 1]: the log-softmax over the first ``text_vocab`` columns of the
    last M rows, at each row's token.

    In ONNX: one Slice over both axes (the exporter writes a slice per axis, and ONNX Runtime copies on every
    Slice: two copies of the scored logits), then -log(sum_j exp(x_j - x_token)). Relative to the token's own
    logit the terms need no max pass, and the subtraction and exponential run in place (the token's logit is
    read first): one copy of the scored logits beside them. A term overflows only where the token's
    probability is below e^-88, which then comes out as 0. The sum goes in blocks (``sum_blocks``): ONNX
    Runtime's ReduceSum adds a row's 50k terms one by one in float32 (1.7e-5 off, relative), its LogSoftmax
    has an approximate exponential (the normaliser 2.4-2.8e-5 too small on every row of real logits), a
    MatMul with ones would prepack a 3 MB B; blocks of ~3k terms, then the blocks' sums, are within 3e-6 of
    float64.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, text_vocab: int) -> Tensor:  # noqa: ARG004
        text = logits[logits.shape[0] - tokens.shape[0] :, :text_vocab]
        return torch.log_softmax(text, dim=-1).gather(1, tokens)

    @staticmethod
    def symbolic(g, logits, tokens, text_vocab: int):
        const = lambda *values: int64_constant(g, values)  # noqa: E731 (1-D)

        first = lambda t: g.op("Slice", g.op("Shape", t), const(0), const(1))  # noqa: E731
        starts = g.op("Concat", g.op("Sub", first(logits), first(tokens)), const(0), axis_i=0)
        text = g.op("Slice", logits, starts, const(INT64_MAX, text_vocab), const(0, 1))
        picked = g.op("GatherElements", text, tokens, axis_i=1)
        terms = g.op("Reshape", g.op("Exp", g.op("Sub", text, picked)), const(-1, *sum_blocks(text_vocab)))
        total = g.op("ReduceSum", g.op("ReduceSum", terms, const(2), keepdims_i=0), const(1), keepdims_i=1)
        out = g.op("Neg", g.op("Log", total))
        out.setType(logits.type().with_sizes([None, 1]))
        return out


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
        # reshape, ``decoder.SequenceGraph.alignment``). Gathering the other layers' rows to match the last layer's cost
        # a one-token step 11 more nodes (~1.5 %); slicing them after their Gather, 3 MB at JFK's peak.
        frames = int(align[0].shape[3])
        weights = torch.cat([reshape(a, KEEP, -1, frames) for a in align], dim=1)
        # ONNX Runtime runs every node whatever outputs are asked for: a prompt's vocabulary projection, which
        # nothing reads, cost half of the call (tiny.en, 217 tokens: 148 of ~300 ms) until it could be skipped.
        logits, logprobs = self.logits_and_logprobs(x, logit_positions, logprob_positions, logprob_tokens)
        return logits, torch.cat(new_k, dim=1), torch.cat(new_v, dim=1), weights, logprobs


# TextDecoderSequence's last inputs: which positions get logits, which get token log-probabilities, and the tokens
SEQUENCE_SELECTORS = ("logit_positions", "logprob_positions", "logprob_tokens")


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


# --- weights --------------------------------------------------------------------------------------------


def _conv_weight(w: np.ndarray) -> Tensor:
    """Linear [out, in] or Conv1d [out, in, k] -> Conv2d [out, in, 1, k]."""
    t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    return t.reshape(t.shape[0], t.shape[1], 1, -1)


def _set_weight(module: nn.Module, w: np.ndarray) -> None:
    """A checkpoint's Linear weight [out, in] into a projection of either layout."""
    t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    module.weight.data = t.reshape(module.weight.shape)


def _load_attn(proj: nn.Module, sd: dict, prefix: str, names=("query", "key", "value", "out")) -> None:
    for n in names:
        _set_weight(getattr(proj, n), sd[f"{prefix}.{n}.weight"])
        if getattr(proj, n).bias is not None:
            getattr(proj, n).bias.data = torch.from_numpy(sd[f"{prefix}.{n}.bias"].astype(np.float32))


def _load_ln(ln: nn.Module, sd: dict, prefix: str) -> None:
    ln.weight.data = torch.from_numpy(sd[f"{prefix}.weight"].astype(np.float32))
    ln.bias.data = torch.from_numpy(sd[f"{prefix}.bias"].astype(np.float32))


def _load_mlp(mlp: MLP, sd: dict, prefix: str) -> None:
    for mine, theirs in (("fc1", "0"), ("fc2", "2")):
        _set_weight(getattr(mlp, mine), sd[f"{prefix}.{theirs}.weight"])
        getattr(mlp, mine).bias.data = torch.from_numpy(sd[f"{prefix}.{theirs}.bias"].astype(np.float32))


def build_encoder(ckpt, sdpa: str = "chunked", layout: str = "ane") -> AudioEncoder:
    sd, dims = ckpt.state_dict, ckpt.dims
    enc = AudioEncoder(dims, sdpa, layout)
    for conv in ("conv1", "conv2"):
        getattr(enc, conv).weight.data = _conv_weight(sd[f"encoder.{conv}.weight"])
        getattr(enc, conv).bias.data = torch.from_numpy(sd[f"encoder.{conv}.bias"].astype(np.float32))
    enc.positional_embedding.data = torch.from_numpy(sd["encoder.positional_embedding"].T.astype(np.float32).copy())
    for i, b in enumerate(enc.blocks):
        _load_attn(b.attn, sd, f"encoder.blocks.{i}.attn")
        _load_ln(b.attn_ln, sd, f"encoder.blocks.{i}.attn_ln")
        _load_mlp(b.mlp, sd, f"encoder.blocks.{i}.mlp")
        _load_ln(b.mlp_ln, sd, f"encoder.blocks.{i}.mlp_ln")
    _load_ln(enc.ln_post, sd, "encoder.ln_post")
    for i in range(dims.n_text_layer):
        _set_weight(enc.cross_key[i], sd[f"decoder.blocks.{i}.cross_attn.key.weight"])
        _set_weight(enc.cross_value[i], sd[f"decoder.blocks.{i}.cross_attn.value.weight"])
        enc.cross_value[i].bias.data = torch.from_numpy(sd[f"decoder.blocks.{i}.cross_attn.value.bias"].astype(np.float32))
    return enc.eval()


def build_decoder(ckpt, cls=TextDecoder, sdpa: str = "einsum", layout: str = "ane",
                  text_vocab: int | None = None) -> TextDecoderBase:  # fmt: skip
    sd, dims = ckpt.state_dict, ckpt.dims
    dec = cls(dims, ckpt.alignment_heads, sdpa, layout, text_vocab)
    dec.token_embedding.weight.data = torch.from_numpy(sd["decoder.token_embedding.weight"].astype(np.float32))
    dec.positional_embedding.data = torch.from_numpy(sd["decoder.positional_embedding"].astype(np.float32))
    for i, b in enumerate(dec.blocks):
        p = f"decoder.blocks.{i}"
        _load_attn(b.attn, sd, f"{p}.attn")
        _load_ln(b.attn_ln, sd, f"{p}.attn_ln")
        _load_attn(b.cross_attn, sd, f"{p}.cross_attn", names=("query", "out"))
        _load_ln(b.cross_attn_ln, sd, f"{p}.cross_attn_ln")
        _load_mlp(b.mlp, sd, f"{p}.mlp")
        _load_ln(b.mlp_ln, sd, f"{p}.mlp_ln")
    _load_ln(dec.ln, sd, "decoder.ln")
    return dec.eval()
