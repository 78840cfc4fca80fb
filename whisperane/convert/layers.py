"""Building blocks of the torch components: projections and norms of either layout, reshapes exported with
constant targets, the MLP and attention projections, the text log-probabilities operator, and loading a
checkpoint's weights into them."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
    Runtime runs on every call where the batch or token count is dynamic (most of the one-token step's nodes)."""

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


def sum_blocks(n: int, longest: int = 4096) -> tuple[int, int]:
    """(blocks, block length) of a sum of n terms: the longest block of at most ``longest`` that divides n."""
    length = max(d for d in range(1, min(n, longest) + 1) if n % d == 0)
    return n // length, length


class TextLogprobs(torch.autograd.Function):
    """logits [N, V] and tokens [M, 1] -> [M, 1]: the log-softmax over the first ``text_vocab`` columns of the
    last M rows, at each row's token.

    In ONNX: one Slice over both axes (the exporter writes a slice per axis, and ONNX Runtime copies on every
    Slice: two copies of the scored logits), then -log(sum_j exp(x_j - x_token)). Relative to the token's own
    logit the terms need no max pass, and the subtraction and exponential run in place (the token's logit is
    read first): one copy of the scored logits beside them. A term overflows only where the token's
    probability is below e^-88, which then comes out as 0. The sum goes in blocks (``sum_blocks``): ONNX
    Runtime's ReduceSum adds a row's 50k terms one by one in float32, its LogSoftmax has an approximate
    exponential (the normaliser too small on every row of real logits), a MatMul with ones would prepack a B
    of its own; blocks of ~3k terms, then the blocks' sums, come close to float64 with no extra weights.
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


# --- weights ----------------------------------------------------------------------------------------------


def conv_weight(w: np.ndarray) -> Tensor:
    """Linear [out, in] or Conv1d [out, in, k] -> Conv2d [out, in, 1, k]."""
    t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    return t.reshape(t.shape[0], t.shape[1], 1, -1)


def set_weight(module: nn.Module, w: np.ndarray) -> None:
    """A checkpoint's Linear weight [out, in] into a projection of either layout."""
    t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    module.weight.data = t.reshape(module.weight.shape)


def load_attention(proj: nn.Module, sd: dict, prefix: str, names=("query", "key", "value", "out")) -> None:
    for n in names:
        set_weight(getattr(proj, n), sd[f"{prefix}.{n}.weight"])
        if getattr(proj, n).bias is not None:
            getattr(proj, n).bias.data = torch.from_numpy(sd[f"{prefix}.{n}.bias"].astype(np.float32))


def load_layer_norm(ln: nn.Module, sd: dict, prefix: str) -> None:
    ln.weight.data = torch.from_numpy(sd[f"{prefix}.weight"].astype(np.float32))
    ln.bias.data = torch.from_numpy(sd[f"{prefix}.bias"].astype(np.float32))


def load_mlp(mlp: MLP, sd: dict, prefix: str) -> None:
    for mine, theirs in (("fc1", "0"), ("fc2", "2")):
        set_weight(getattr(mlp, mine), sd[f"{prefix}.{theirs}.weight"])
        getattr(mlp, mine).bias.data = torch.from_numpy(sd[f"{prefix}.{theirs}.bias"].astype(np.float32))
