"""Silero VAD's graph with its 1-D convolutions written as 2-D ones, for ONNX Runtime's CPU kernels.

ONNX Runtime runs 2-D convolutions with its blocked-channel (NCHWc) kernels and 1-D ones through a generic
im2col path. Silero's sequence model is 1-D convolutions over a few frames per 32 ms window (its STFT, then
four encoder layers), and that path runs them far below the machine's rate. The same convolutions over a
height-1 image, with the first encoder layer's 129 input channels zero-padded to a multiple of the kernels'
channel block, run the call far faster; the probabilities move only by
float rounding (the LSTM carries its state across calls; tests/test_vad.py holds the bound).

The rewrite needs the ``onnx`` package (the build side's). Without it the model runs as published: the same
probabilities to float rounding, only slower. The rewritten file is cached by the source's sha256.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np

from ..util import file_sha256

CHANNEL_BLOCK = 16  # ONNX Runtime's NCHWc block with AVX-512 (8 with AVX2 divides it)


def conv2d_variant(path: Path, cache_dir: Path) -> Path:
    """The rewritten copy of the Silero model at ``path``, made on first use in ``cache_dir`` under the source's
    sha256 (a model named by the user is never written beside), or ``path`` itself when the ``onnx`` package is
    not installed, the graph has nothing to rewrite or the cache cannot be written."""
    target = cache_dir / f"{file_sha256(path)[:16]}.conv2d.onnx"
    if target.is_file():
        return target
    try:
        import onnx
    except ImportError:
        return path
    model = onnx.load(str(path))
    if not _rewrite_convs(model.graph):
        return path
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(tmp))
        os.replace(tmp, target)
    except OSError:  # a read-only cache: the published graph
        return path
    return target


def _rewrite_convs(graph) -> int:
    """Every Conv with a 3-D weight initializer as Unsqueeze -> 2-D Conv -> Squeeze; returns how many."""
    from onnx import helper, numpy_helper

    weights = {w.name: w for w in graph.initializer}
    uses = Counter(name for node in graph.node for name in node.input)
    nodes, count = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = weights.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if (weight is None or len(weight.dims) != 3 or uses[weight.name] != 1
                or attrs.get("auto_pad", b"NOTSET") != b"NOTSET"):
            nodes.append(node)
            continue
        if not count:
            graph.initializer.append(numpy_helper.from_array(_int64([2]), "conv2d.axis"))
        count += 1
        w = numpy_helper.to_array(weight)[:, :, None, :]  # [out, in, 1, k]
        x = f"{node.output[0]}.conv2d.in"
        nodes.append(helper.make_node("Unsqueeze", [node.input[0], "conv2d.axis"], [x]))
        pad = -w.shape[1] % CHANNEL_BLOCK if attrs.get("group", 1) == 1 and w.shape[1] > CHANNEL_BLOCK else 0
        if pad:  # zero channels in and zero weights for them: the same sums, and the blocked kernels apply
            w = np.pad(w, ((0, 0), (0, pad), (0, 0), (0, 0)))
            graph.initializer.append(numpy_helper.from_array(_int64([0, 0, 0, 0, 0, pad, 0, 0]), f"{x}.pads"))
            nodes.append(helper.make_node("Pad", [x, f"{x}.pads"], [f"{x}.padded"]))
            x = f"{x}.padded"
        weight.CopyFrom(numpy_helper.from_array(w, weight.name))
        y = f"{node.output[0]}.conv2d.out"
        nodes.append(helper.make_node("Conv", [x, *node.input[1:]], [y], name=node.name, **_as_2d(attrs)))
        nodes.append(helper.make_node("Squeeze", [y, "conv2d.axis"], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def _as_2d(attrs: dict) -> dict:
    out = dict(attrs)
    for name in ("kernel_shape", "strides", "dilations"):
        if name in out:
            out[name] = [1, *out[name]]
    if "pads" in out:
        out["pads"] = [0, out["pads"][0], 0, out["pads"][1]]
    return out


def _int64(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)
