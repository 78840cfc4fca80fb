"""int8 quantization of exported ONNX components for ONNX Runtime on the CPU.

Decoders (:func:`quantize_int8`): weight-only ``MatMulNBits``.

Every ``MatMul`` whose right operand is a constant [K, N] becomes ``MatMulNBits`` with 8-bit weights in blocks
of ``block_size`` along K (one fp32 scale per block, symmetric: zero point 128) and ``accuracy_level=4``, which
lets ONNX Runtime quantize the activations per block as well and run integer dot products. The tied token
embedding is quantized once and serves both of its uses: the logits ``Gemm(x, E, transB=1)`` becomes
``MatMulNBits`` over E's rows (the [N, K] layout MatMulNBits stores anyway) and the embedding ``Gather`` reads
the same bytes and scales and dequantizes the rows it picks, so the largest tensor is held once, in int8.

With ``host_embedding``, the lookup leaves the graph instead: the ``Gather`` becomes the graph input
``token_embeddings`` [B, T, d] and the quantized rows are written to a ``.npy`` file of packed rows (each row's
bytes, then its block scales' bytes: :func:`pack_rows`; read by ``whisperane.runtime.decoder_adapters.TokenTable``), which the host
memory-maps and reads a few rows of per call. ONNX Runtime then holds the embedding once, prepacked for the
logits, rather than twice (its prepacked copy and the bytes the ``Gather`` reads: 20 MB on tiny.en, 26.5 MB on
base); the host's mapped file is resident only in the pages of the tokens it has looked up.

Only the BTC-layout graphs have such MatMuls: the ANE layout's 1x1 convolutions are left as they are.

Encoder (:func:`quantize_dynamic_int8`): ``MatMulNBits`` computes one token at a time well but is slower than
fp32 GEMM on 1500 frames (AVX2), so the encoder's MatMuls use ONNX Runtime's dynamic quantization instead
(int8 activations per tensor, 7-bit weights per output channel so that AVX2's u8 x s8 pair sums cannot
saturate): faster than the fp32 GEMM. The MLPs' second projections
quantize their activations per row (ENCODER_ROW_QUANTIZED).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..contract import TOKEN_EMBEDDINGS
from .export_onnx import embedding_name

BITS = 8
ZERO_POINT = 1 << (BITS - 1)  # MatMulNBits' default zero point when none is given


def quantize_rows(w: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float -> (uint8 [N, K / block_size, block_size], fp32 scales [N, K / block_size])."""
    n, k = w.shape
    blocks = w.reshape(n, k // block_size, block_size).astype(np.float32)
    scales = np.abs(blocks).max(axis=2) / (ZERO_POINT - 1)
    scales = np.where(scales == 0, 1.0, scales).astype(np.float32)
    q = np.clip(np.rint(blocks / scales[..., None]), -(ZERO_POINT - 1), ZERO_POINT - 1) + ZERO_POINT
    return q.astype(np.uint8), scales


def dequantize_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The inverse of :func:`quantize_rows`: [N, K] float32."""
    return ((q.astype(np.float32) - ZERO_POINT) * scales[..., None]).reshape(q.shape[0], -1)


def pack_rows(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """uint8 [N, K / b, b] and fp32 [N, K / b] -> uint8 [N, K + 4 K / b]: each row's bytes, then its scales."""
    n = q.shape[0]
    return np.concatenate([q.reshape(n, -1), np.ascontiguousarray(scales, dtype="<f4").view(np.uint8)], axis=1)


def _matmul_nbits(a: str, weight: str, output: str, name: str, n: int, k: int, block_size: int) -> onnx.NodeProto:
    return helper.make_node(
        "MatMulNBits", [a, f"{weight}_q8", f"{weight}_scales"], [output], name=name, domain="com.microsoft",
        K=k, N=n, bits=BITS, block_size=block_size, accuracy_level=4,
    )


def _gather_dequantized(emb: str, indices: str, output: str, k: int) -> list[onnx.NodeProto]:
    """Gather rows of the quantized embedding and dequantize them: output [*indices.shape, k]."""
    o = output
    return [
        helper.make_node("Gather", [f"{emb}_q8", indices], [f"{o}/q"], axis=0),
        helper.make_node("Gather", [f"{emb}_scales", indices], [f"{o}/scales"], axis=0),
        helper.make_node("Cast", [f"{o}/q"], [f"{o}/qf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", [f"{o}/qf", "q8/zero_point"], [f"{o}/centered"]),
        helper.make_node("Unsqueeze", [f"{o}/scales", "q8/last_axis"], [f"{o}/scales1"]),
        helper.make_node("Mul", [f"{o}/centered", f"{o}/scales1"], [f"{o}/blocks"]),
        helper.make_node("Shape", [indices], [f"{o}/index_shape"]),
        helper.make_node("Concat", [f"{o}/index_shape", "q8/embed_dim"], [f"{o}/shape"], axis=0),
        helper.make_node("Reshape", [f"{o}/blocks", f"{o}/shape"], [o]),
    ]


def quantize_int8(src: Path, dst: Path, block_size: int = 32, host_embedding: Path | None = None) -> int:
    """Write ``src`` with int8 weights to ``dst``; returns the number of weight matrices quantized.

    ``host_embedding``: write the token embedding's packed int8 rows there and take ``token_embeddings`` as an
    input in place of the graph's lookup.
    """
    model = onnx.load(str(src))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    emb = embedding_name(model)
    added: dict[str, onnx.TensorProto] = {}
    replaced: set[str] = set()
    nodes: list[onnx.NodeProto] = []

    def add_quantized(name: str, rows: np.ndarray) -> None:
        if name not in added:
            q, s = quantize_rows(rows, block_size)
            added[name] = numpy_helper.from_array(q, f"{name}_q8")
            added[f"{name}/s"] = numpy_helper.from_array(s, f"{name}_scales")
        replaced.add(name)

    for node in graph.node:
        b = node.input[1] if len(node.input) > 1 else ""
        if node.op_type == "MatMul" and b in inits and len(inits[b].dims) == 2 and inits[b].dims[0] % block_size == 0:
            k, n = inits[b].dims
            add_quantized(b, numpy_helper.to_array(inits[b]).T)
            nodes.append(_matmul_nbits(node.input[0], b, node.output[0], node.name + "/q8", n, k, block_size))
        elif emb and node.op_type == "Gemm" and b == emb and len(node.input) == 2:
            n, k = inits[emb].dims
            add_quantized(emb, numpy_helper.to_array(inits[emb]))
            nodes.append(_matmul_nbits(node.input[0], emb, node.output[0], node.name + "/q8", n, k, block_size))
        elif emb and node.op_type == "Gather" and node.input[0] == emb and host_embedding is not None:
            n, k = inits[emb].dims
            add_quantized(emb, numpy_helper.to_array(inits[emb]))  # the same rows the logits' MatMulNBits reads
            np.save(host_embedding, pack_rows(numpy_helper.to_array(added[emb]), numpy_helper.to_array(added[f"{emb}/s"])))
            index = next((i for i in graph.input if i.name == node.input[1]), None)
            lead = [d.dim_param or d.dim_value for d in index.type.tensor_type.shape.dim] if index else ["batch", "tokens"]
            graph.input.append(helper.make_tensor_value_info(TOKEN_EMBEDDINGS, TensorProto.FLOAT, [*lead, k]))
            nodes.append(helper.make_node("Identity", [TOKEN_EMBEDDINGS], [node.output[0]], name=node.name + "/host"))
        elif emb and node.op_type == "Gather" and node.input[0] == emb:
            n, k = inits[emb].dims
            add_quantized(emb, numpy_helper.to_array(inits[emb]))
            nodes += _gather_dequantized(emb, node.input[1], node.output[0], k)
            for name, value in (("q8/zero_point", np.array(float(ZERO_POINT), np.float32)),
                                ("q8/last_axis", np.array([-1], np.int64)), ("q8/embed_dim", np.array([k], np.int64))):
                added[name] = numpy_helper.from_array(value, name)
        else:
            nodes.append(node)
    if not replaced:
        return 0
    del graph.node[:]
    graph.node.extend(nodes)
    still_used = {i for node in graph.node for i in node.input}
    for name in replaced - still_used:
        graph.initializer.remove(inits[name])
    graph.initializer.extend(added.values())
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(dst))
    return len(replaced)


# The MLPs' second projections get int8 activations with a scale and zero point per row (frame) instead of the
# dynamic quantization's one per tensor: their input (GELU's output) has its outliers in a few frames, so one
# scale for the whole tensor leaves little resolution for the rest; with one scale per tensor they would have to
# stay float32.
ENCODER_ROW_QUANTIZED = "/mlp/fc2/"
WEIGHT_LEVELS = 63  # 7-bit weights: AVX2's u8 x s8 pair sums (vpmaddubsw) cannot saturate


def quantize_dynamic_int8(src: Path, dst: Path) -> None:
    """Every MatMul with a constant right operand -> ONNX Runtime's dynamically quantized int8 MatMul, but the
    MLPs' second projections (ENCODER_ROW_QUANTIZED) -> int8 with activations quantized per row."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(src), load_external_data=False)
    keep = [n.name for n in model.graph.node if n.op_type == "MatMul" and ENCODER_ROW_QUANTIZED in n.name]
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                     op_types_to_quantize=["MatMul"], nodes_to_exclude=keep)
    model = onnx.load(str(dst))
    inits = {i.name: i for i in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.name in keep and node.input[1] in inits:
            weight = numpy_helper.to_array(inits[node.input[1]])
            nodes += _row_quantized_matmul(node, weight, model.graph.initializer)
        else:
            nodes.append(node)
    still_used = {i for n in nodes for i in n.input}
    for name in [name for name in inits if name not in still_used]:  # the float weights replaced
        model.graph.initializer.remove(inits[name])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(dst))


def _row_quantized_matmul(node: onnx.NodeProto, weight: np.ndarray, initializers) -> list[onnx.NodeProto]:
    """``A @ W`` (A [..., K] float, W [K, N] constant) with A quantized per row to uint8 (asymmetric: scale s and
    zero point z per row) and W per column to 7 bits (scale w): y = s * w * (Aq @ Wq - z * colsum(Wq)). The
    zero points are applied after the product: ONNX Runtime's MatMulInteger takes one zero point for A."""
    k, n = weight.shape
    w_scale = np.maximum(np.abs(weight).max(axis=0), np.finfo(np.float32).tiny) / WEIGHT_LEVELS
    wq = np.clip(np.rint(weight / w_scale), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    p = node.name
    consts = {f"{p}/wq": wq, f"{p}/w_scale": w_scale.astype(np.float32),
              f"{p}/colsum": wq.astype(np.float32).sum(axis=0), f"{p}/rows_k": np.array([-1, k], np.int64),
              f"{p}/zero": np.array(0, np.float32), f"{p}/levels": np.array(255, np.float32),
              f"{p}/tiny": np.array(np.finfo(np.float32).tiny, np.float32), f"{p}/minus_one": np.array([-1], np.int64),
              f"{p}/n": np.array([n], np.int64), f"{p}/zero_i": np.array([0], np.int64)}
    initializers.extend(numpy_helper.from_array(v, name) for name, v in consts.items())
    x, y = node.input[0], node.output[0]

    def op(kind: str, inputs: list[str], out: str, **attrs) -> onnx.NodeProto:
        return helper.make_node(kind, inputs, [f"{p}/{out}"], name=f"{p}/{out}", **attrs)

    return [
        op("Reshape", [x, f"{p}/rows_k"], "a"),  # [M, K]
        op("ReduceMin", [f"{p}/a"], "min", axes=[1]), op("ReduceMax", [f"{p}/a"], "max", axes=[1]),
        op("Min", [f"{p}/min", f"{p}/zero"], "lo"), op("Max", [f"{p}/max", f"{p}/zero"], "hi"),
        op("Sub", [f"{p}/hi", f"{p}/lo"], "range"), op("Div", [f"{p}/range", f"{p}/levels"], "step"),
        op("Max", [f"{p}/step", f"{p}/tiny"], "scale"),  # [M, 1]
        op("Div", [f"{p}/lo", f"{p}/scale"], "neg_zp"), op("Neg", [f"{p}/neg_zp"], "zp_raw"),
        op("Round", [f"{p}/zp_raw"], "zp"),  # [M, 1] float, in [0, 255]
        op("Reshape", [f"{p}/scale", f"{p}/minus_one"], "scale_m"),
        op("Cast", [f"{p}/zp"], "zp_u8", to=TensorProto.UINT8), op("Reshape", [f"{p}/zp_u8", f"{p}/minus_one"], "zp_m"),
        op("QuantizeLinear", [f"{p}/a", f"{p}/scale_m", f"{p}/zp_m"], "aq", axis=0),
        op("MatMulInteger", [f"{p}/aq", f"{p}/wq"], "acc"),  # int32 [M, N]
        op("Cast", [f"{p}/acc"], "accf", to=TensorProto.FLOAT),
        op("Mul", [f"{p}/zp", f"{p}/colsum"], "offset"), op("Sub", [f"{p}/accf", f"{p}/offset"], "centered"),
        op("Mul", [f"{p}/scale", f"{p}/w_scale"], "out_scale"), op("Mul", [f"{p}/centered", f"{p}/out_scale"], "y2"),
        op("Shape", [x], "x_shape"), op("Slice", [f"{p}/x_shape", f"{p}/zero_i", f"{p}/minus_one"], "lead"),
        op("Concat", [f"{p}/lead", f"{p}/n"], "y_shape", axis=0),
        helper.make_node("Reshape", [f"{p}/y2", f"{p}/y_shape"], [y], name=f"{p}/y"),
    ]
