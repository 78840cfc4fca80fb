"""Interchangeable attention implementations of the torch components (``SDPA_IMPLEMENTATIONS``), chosen per
component with one argument, and ONNX Runtime's fused operator for the encoder (``self_attention``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .layers import heads, unheads

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
    CPU kernel packs w for a product of one column when Tq = 1 (the one-token step): slower than this form at
    one row and at 8; w @ v^T is faster for prompts as well."""
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
    windows, faster than the chunked form), not for export."""
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
                        "fused": sdpa_fused}


def self_attention(sdpa: str, n_head: int, layout: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Self-attention as a function of the q, k, v projections in ``layout`` (the encoder's), output in ``layout``:
    one of SDPA_IMPLEMENTATIONS between the head split and merge, or (``"mha"``, BTC only) ONNX Runtime's
    MultiHeadAttention on the projections as they are, exported as one node. Its CPU kernel keeps the
    [H, 1500, 1500] scores out of memory; the chunked MatMul/Softmax/MatMul form is slower per layer."""
    if sdpa == "mha":
        if layout == "ane":
            raise ValueError("mha is ONNX Runtime's operator, for the BTC layout")
        return lambda q, k, v: _MultiHeadAttention.apply(q, k, v, n_head)
    fn = SDPA_IMPLEMENTATIONS[sdpa]

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        o, _ = fn(*(heads(t, n_head, layout) for t in (q, k, v)), None)
        return unheads(o, layout)

    return attend
