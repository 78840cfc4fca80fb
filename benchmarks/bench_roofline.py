"""A roofline for whisperane's single-stream speed (issue 12): every per-window and per-step figure beside its limit.

Prints markdown (see benchmarks/README.md, "Roofline"):

- machine limits, measured with the given threads: streaming-read bandwidth (numpy's SIMD max over a 512 MiB
  float32 array, and over 16 MiB, which stays in the last-level cache; T threads read T parts at once) and the
  throughput of ONNX Runtime's own kernels at the model's shapes, on one-node graphs built in memory: float32
  MatMul, the int8 encoder's dynamically quantized MatMulInteger pattern, the int8 decoder's MatMulNBits (8 bits,
  blocks of 32, accuracy_level 4, also with the caches flushed before each run), the conv stem's Conv and the
  attention's batched MatMuls;
- work: the FLOPs of one encoder window (from the bundle's dims and its int8 encoder graph), the bytes one
  int8 decoder step reads, the FLOPs of the multi-token decoder calls;
- the measured split on the long file: a loaded model (default compute type: int8 on the CPU; greedy, word
  timestamps on) whose component calls are timed by wrapping its methods (``bench.ComponentClock``), decoder
  calls told apart as one-token steps, the previous-text prompt, the prefix from <|startoftranscript|> and the
  word-alignment pass, each beside its limit (the larger of its compute time at the probed throughputs and its
  bytes at the measured bandwidth).

    python benchmarks/bench_roofline.py [--models tiny.en,base] [--threads 2] [--long FILE] [--quick]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from whisperane.runtime.state import CAPACITY_BLOCK, capacity_for

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import (  # noqa: E402
    REPO,
    SAMPLE_RATE,
    Bench,
    ComponentClock,
    build_long_file,
    emit,
    header,
    load_corpus,
    loadavg,
    progress,
    read_16k_mono,
    section,
    table,
)

FLOAT = 4  # bytes of a float32
READ_MIB = 512  # larger than any last-level cache: a stream from DRAM
CACHED_MIB = 16  # fits this kind of machine's last-level cache (35.8 MiB, shared)
FLUSH_MIB = 128  # read between the runs of a cold probe, to evict its weights from the caches
TAIL_REVISION = 17  # the converter revision from which a call with no logits skips the last layer's tail
NBITS_BLOCK = 32  # the int8 decoder's MatMulNBits: 8-bit weights in blocks of 32 (the converter's quantize)
NBITS_ACCURACY = 4  # ... with int8 activations
DECODER_M = (1, 100, 224)  # one token; a typical word-alignment pass; the longest previous-text prompt
VOCAB_M = (1, 5, 100)  # steps, the prefix from <|startoftranscript|>, the alignment pass
COMPUTE_M = 100  # probes from this M on are compute-bound; below it, reading the weights bounds them
PROMPT_TOKENS = 224  # the longest previous-text prompt (n_text_ctx // 2)
LONG_SECONDS = 600  # the default long file: the English corpus clips built into >= 10 minutes, as bench.py does
QUICK_SECONDS = 120
WARMUP_SECONDS = 30
ALIGNMENT_PASS = [False]  # set while longform.words.teacher_forced (the word-alignment pass) runs
MB = 1e6


# --- machine limits -------------------------------------------------------------------------------------------


def in_parallel(jobs: Sequence[Callable[[], object]]) -> None:
    """Run the jobs at once, one Python thread each (numpy's reductions release the GIL)."""
    if len(jobs) == 1:
        jobs[0]()
        return
    workers = [threading.Thread(target=job) for job in jobs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def read_bandwidth(mib: int, threads: int, repeats: int) -> float:
    """GB/s of streaming reads of a float32 array: numpy's max (a SIMD reduction: a few instructions per 64 bytes,
    no BLAS threads) over ``threads`` parts at once. A small array is read several times per run, so that a run
    lasts as long as one over a large array. Best of ``repeats``."""
    data = np.ones(mib * 2**20 // FLOAT, dtype=np.float32)  # written: every page is resident
    parts = np.array_split(data, threads)
    passes = max(1, READ_MIB // mib)

    def read(part: np.ndarray) -> None:
        for _ in range(passes):
            part.max()

    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        in_parallel([lambda p=p: read(p) for p in parts])
        best = min(best, time.perf_counter() - t0)
    return passes * data.nbytes / best / 1e9


@dataclass(frozen=True)
class Probe:
    """One ONNX Runtime kernel at one shape: Y [batch, m, n] = A [batch, m, k] @ W [k, n]. A conv is its GEMM:
    m output frames, k = input channels x 3 taps, n output channels."""

    kind: str  # "float32", "int8", "nbits", "attention" (two activations), "conv"
    m: int
    k: int
    n: int
    batch: int = 1  # attention heads
    stride: int = 1  # conv
    cold: bool = False  # the caches flushed before each run

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n

    @property
    def bytes_read(self) -> float | None:
        """Weights in their stored precision (with scales) plus the float32 input; None for a conv."""
        weights = {"float32": FLOAT * self.k * self.n, "int8": self.k * self.n + FLOAT * self.n,
                   "nbits": self.k * self.n * (1 + FLOAT / NBITS_BLOCK),
                   "attention": FLOAT * self.batch * self.k * self.n}.get(self.kind)
        return None if weights is None else weights + FLOAT * self.batch * self.m * self.k

    @property
    def input_shape(self) -> tuple[int, ...]:
        if self.kind == "conv":
            return (1, self.k // 3, 1, self.m * self.stride)
        return (self.batch, self.m, self.k) if self.kind == "attention" else (self.m, self.k)


KERNELS = {  # in the order the probes are listed
    "conv": "Conv float32",
    "float32": "MatMul float32",
    "int8": "MatMulInteger int8 (dynamic quantization, as the int8 encoder)",
    "attention": "MatMul float32, batched over heads",
    "nbits": "MatMulNBits 8-bit, accuracy_level 4",
}


def _float32_graph(p: Probe, rng: np.random.Generator) -> tuple[list, dict, dict]:
    from onnx import helper

    return [helper.make_node("MatMul", ["a", "w"], ["y"])], {"w": rng.standard_normal((p.k, p.n), np.float32)}, {}


def _int8_graph(p: Probe, rng: np.random.Generator) -> tuple[list, dict, dict]:
    """The int8 encoder's pattern (DynamicQuantizeLinear, MatMulInteger with per-column int8 weights, the scale
    product, the bias); ONNX Runtime's optimizer fuses it as it fuses the encoder's."""
    from onnx import TensorProto, helper

    weights = {"w": rng.integers(-64, 64, (p.k, p.n), dtype=np.int8), "w_zero": np.zeros(p.n, np.int8),
               "w_scale": np.full(p.n, 0.01, np.float32), "bias": np.zeros(p.n, np.float32)}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["a"], ["a_q", "a_scale", "a_zero"]),
        helper.make_node("MatMulInteger", ["a_q", "w", "a_zero", "w_zero"], ["y_int"]),
        helper.make_node("Cast", ["y_int"], ["y_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["a_scale", "w_scale"], ["scale"]),
        helper.make_node("Mul", ["y_float", "scale"], ["y_scaled"]),
        helper.make_node("Add", ["bias", "y_scaled"], ["y"]),
    ]
    return nodes, weights, {}


def _nbits_graph(p: Probe, rng: np.random.Generator) -> tuple[list, dict, dict]:
    from onnx import helper

    blocks = p.k // NBITS_BLOCK
    weights = {"w": rng.integers(0, 256, (p.n, blocks, NBITS_BLOCK), dtype=np.uint8),
               "w_scale": np.full((p.n, blocks), 0.01, np.float32)}
    node = helper.make_node("MatMulNBits", ["a", "w", "w_scale"], ["y"], domain="com.microsoft", K=p.k, N=p.n,
                            bits=8, block_size=NBITS_BLOCK, accuracy_level=NBITS_ACCURACY)
    return [node], weights, {}


def _attention_graph(p: Probe, rng: np.random.Generator) -> tuple[list, dict, dict]:
    from onnx import helper

    return [helper.make_node("MatMul", ["a", "b"], ["y"])], {}, {"b": rng.standard_normal((p.batch, p.k, p.n), np.float32)}


def _conv_graph(p: Probe, rng: np.random.Generator) -> tuple[list, dict, dict]:
    """The conv stem's: kernel 3 along time, padding 1, stride 1 or 2, on [1, C, 1, T]."""
    from onnx import helper

    weights = {"w": rng.standard_normal((p.n, p.k // 3, 1, 3), np.float32), "bias": np.zeros(p.n, np.float32)}
    node = helper.make_node("Conv", ["a", "w", "bias"], ["y"], kernel_shape=[1, 3], pads=[0, 1, 0, 1],
                            strides=[1, p.stride])
    return [node], weights, {}


def _identity_graph(p: Probe, rng: np.random.Generator) -> tuple[list, dict, dict]:
    """No work: the cost of one ``session.run`` from Python, taken off every probe's time."""
    from onnx import helper

    return [helper.make_node("Identity", ["a"], ["y"])], {}, {}


PROBE_GRAPHS = {"float32": _float32_graph, "int8": _int8_graph, "nbits": _nbits_graph,
                "attention": _attention_graph, "conv": _conv_graph, "identity": _identity_graph}
RUN_OVERHEAD_REPEATS = 50


def probe_session(p: Probe, threads: int):
    """An ONNX Runtime session of the probe's one-operation graph, and its inputs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, inputs = PROBE_GRAPHS[p.kind](p, rng)
    inputs = {"a": rng.standard_normal(p.input_shape, np.float32), **inputs}
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info(name, TensorProto.FLOAT, x.shape) for name, x in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(x, name) for name, x in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # as whisperane's sessions
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]), inputs


def time_probe(p: Probe, threads: int, repeats: int, flush: np.ndarray, overhead: float = 0.0) -> float:
    """Best seconds of one run (after a warm-up run: weight prepacking, the arena), less ``overhead`` (the
    time of a run that does nothing)."""
    session, feeds = probe_session(p, threads)
    session.run(None, feeds)
    best = math.inf
    for _ in range(repeats):
        if p.cold:
            flush.max()
        t0 = time.perf_counter()
        session.run(None, feeds)
        best = min(best, time.perf_counter() - t0)
    return max(best - overhead, 1e-7)


# --- the model's shapes and work ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphWork:
    """What an int8 graph computes and holds: its GEMMs by (kind, K, N) and its initializers' bytes."""

    gemms: Counter
    weight_bytes: int
    vocab_bytes: int  # the initializers of the GEMM with N = vocabulary (the decoder's tied projection)


def read_graph(path: Path, vocab: int) -> GraphWork:
    """The GEMMs with weights of an ONNX graph: MatMulNBits by its K/N attributes, MatMulInteger ("int8") and
    MatMul ("float32") by their 2-D weight initializers; MatMuls of two activations (attention) are left out."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path)).graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    sizes = {t.name: int(np.prod(t.dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in graph.initializer}
    gemms: Counter = Counter()
    vocab_bytes = 0
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            gemms["nbits", attrs["K"], attrs["N"]] += 1
            if attrs["N"] == vocab:
                vocab_bytes += sum(sizes.get(name, 0) for name in node.input)
        elif node.op_type in ("MatMulInteger", "MatMul") and len(shapes.get(node.input[1], ())) == 2:
            k, n = shapes[node.input[1]]
            gemms["int8" if node.op_type == "MatMulInteger" else "float32", k, n] += 1
    return GraphWork(gemms, sum(sizes.values()), vocab_bytes)


@dataclass(frozen=True)
class Shapes:
    """A bundle's dims as the roofline uses them, and its int8 graphs' GEMMs and weights."""

    d: int  # encoder and decoder width (equal in every Whisper model)
    heads: int
    encoder_layers: int
    decoder_layers: int
    frames: int  # encoder frames of a window (1500)
    mels: int
    vocab: int
    cache: int  # the decoder's fixed self-attention cache length
    encoder: GraphWork
    decoder: GraphWork
    tail_skipped: bool = False  # converter revision 17 on: a call with no logits skips the last layer's tail

    @classmethod
    def of_bundle(cls, bundle: Path) -> Shapes:
        from whisperane.runtime.bundle import BundleInfo

        info = BundleInfo.load(bundle)
        dims, files = info.dims, info.config["components"]
        return cls(dims.n_audio_state, dims.n_audio_head, dims.n_audio_layer, dims.n_text_layer, dims.n_audio_ctx,
                   dims.n_mels, dims.n_vocab, info.cache_length,
                   read_graph(bundle / files["AudioEncoder"]["onnx-int8"], dims.n_vocab),
                   read_graph(bundle / files["TextDecoderSequence"]["onnx-int8"], dims.n_vocab),
                   info.config.get("conversion_options", {}).get("converter_revision", 0) >= TAIL_REVISION)

    def decoder_gemms(self, logits: bool) -> Counter:
        """The decoder's GEMMs that a call runs, (kind, K, N) -> count: a call with no logits runs no vocabulary
        projection, and from converter revision 17 only the key and value projections of the last layer (not its
        query and output projections, cross-attention's two, fc1 and fc2)."""
        gemms = Counter({key: n for key, n in self.decoder.gemms.items() if logits or key[2] != self.vocab})
        if not logits and self.tail_skipped:
            gemms -= Counter({("nbits", self.d, self.d): 4, ("nbits", self.d, 4 * self.d): 1, ("nbits", 4 * self.d, self.d): 1})
        return gemms

    def attention_layers(self, logits: bool) -> int:
        """The decoder layers whose attention a call computes (the last one's is skipped as its tail is)."""
        return self.decoder_layers - (not logits and self.tail_skipped)

    def cache_positions(self, position: float) -> int:
        """The self-attention positions a call reads at a row's ``position``: none on an empty state (a graph
        that takes any length), else the int8 decoder state's capacity, the positions reached rounded up to
        a block (``decoder.GrowingState``): the graph concatenates the new positions onto them and attends over
        them under the padding mask."""
        return capacity_for(math.ceil(position), self.cache) if position > 0 else 0

    def self_cache_bytes(self, positions: int) -> int:
        """One row's self-attention K and V caches over ``positions`` positions."""
        return 2 * self.decoder_layers * self.d * positions * FLOAT

    @property
    def cross_bytes(self) -> int:
        """The cross-attention K and V, float32 [1, d, 1, F] per layer each."""
        return 2 * self.decoder_layers * self.d * self.frames * FLOAT

    def decoder_attention_flops(self, positions: int, tokens: int, layers: int | None = None) -> float:
        """QK^T and AV of one token over the self cache (``positions`` + T) and the F encoder frames, all layers
        (or ``layers``)."""
        return 4.0 * self.d * (positions + tokens + self.frames) * (layers or self.decoder_layers)


def encoder_ops(s: Shapes) -> list[tuple[str, Probe, int]]:
    """One encoder window's operations that carry its FLOPs: (label, the probe at its shape, count)."""
    head = s.d // s.heads
    ops = [("conv stem 1 (float32)", Probe("conv", 2 * s.frames, 3 * s.mels, s.d), 1),
           ("conv stem 2, stride 2 (float32)", Probe("conv", s.frames, 3 * s.d, s.d, stride=2), 1)]
    for (kind, k, n), count in sorted(s.encoder.gemms.items()):
        ops.append((f"{gemm_role(s, k, n)} ({kind})", Probe(kind, s.frames, k, n), count))
    ops += [("attention QK^T (float32)", Probe("attention", s.frames, head, s.frames, batch=s.heads), s.encoder_layers),
            ("attention AV (float32)", Probe("attention", s.frames, s.frames, head, batch=s.heads), s.encoder_layers)]
    return ops


def gemm_role(s: Shapes, k: int, n: int) -> str:
    roles = {(s.d, s.d): "d->d: attention projections", (s.d, 4 * s.d): "d->4d: MLP fc1",
             (4 * s.d, s.d): "4d->d: MLP fc2", (s.d, s.vocab): "d->V: vocabulary projection"}
    return roles.get((k, n), f"{k}->{n}")


def probes_for(s: Shapes) -> list[Probe]:
    """The encoder's operations at their shapes (each GEMM shape both float32 and int8), the decoder's
    MatMulNBits at one token and at multi-token lengths, the vocabulary projection also cold and also int8."""
    probes = [p for _, p, _ in encoder_ops(s)]
    for _, k, n in sorted({key for key in s.encoder.gemms}):
        probes += [Probe(kind, s.frames, k, n) for kind in ("float32", "int8")]
    for _, k, n in sorted(s.decoder.gemms):
        probes += [Probe("nbits", m, k, n) for m in (VOCAB_M if n == s.vocab else DECODER_M)]
    probes.append(Probe("nbits", 1, s.d, s.vocab, cold=True))
    # The vocabulary projection through the encoder's int8 kernel too: the rate a per-token int8 projection
    # would reach (issue 12's alignment pass); not a kernel the decoder runs.
    probes += [Probe("int8", m, s.d, s.vocab) for m in VOCAB_M]
    return sorted(set(probes), key=lambda p: (list(KERNELS).index(p.kind), p.k, p.n, p.m, p.cold))


class Rates:
    """The probes' best times, and the time of an operation at the measured rate of its nearest probe."""

    def __init__(self, best: dict[Probe, float], overhead: float):
        self.best = best
        self.overhead = overhead  # seconds of one session.run that does nothing, taken off every probe
        qk = [p for p in best if p.kind == "attention" and p.n > p.k]
        self.attention = qk[0].flops / best[qk[0]] if qk else math.inf  # FLOP/s of the encoder's QK^T

    def seconds(self, kind: str, m: int, k: int, n: int, min_m: int = 1) -> float:
        """[m, k] @ [k, n] at the FLOP rate of the probe of this kind and (k, n) whose M is nearest (log scale)
        among those with M >= ``min_m``."""
        same = [p for p in self.best if (p.kind, p.k, p.n, p.cold) == (kind, k, n, False) and p.m >= min_m]
        if not same:
            return 0.0
        p = min(same, key=lambda q: abs(math.log(q.m / m)))
        return 2.0 * m * k * n * self.best[p] / p.flops


@dataclass(frozen=True)
class Limit:
    """A call's roofline: the larger of its compute and memory times; ``kernels`` is what ONNX Runtime's kernels
    alone take at its M (the probes at the nearest M, small M included): not a machine limit, a kernel's."""

    compute: float  # seconds of its FLOPs at the probed compute-bound throughputs
    memory: float  # seconds to read its bytes at the measured DRAM bandwidth
    kernels: float

    @property
    def seconds(self) -> float:
        return max(self.compute, self.memory)

    @property
    def bound(self) -> str:
        return "memory" if self.memory >= self.compute else "compute"


def decoder_limit(s: Shapes, rates: Rates, bandwidth: float, rows: int, tokens: int, logits: bool, position: float) -> Limit:
    """One int8 decoder call of rows x tokens at cache ``position``. Compute: its MatMulNBits at the rate of the
    probe of nearest M among the compute-bound ones (M >= COMPUTE_M), attention at the encoder QK^T's float32
    rate. Memory: the weights (without the vocabulary projection when no logits are asked for: the graph skips
    it, given no logit_positions), every row's self cache as far as the state holds it, the cross K/V once, at
    the DRAM bandwidth."""
    m, positions = rows * tokens, s.cache_positions(position)
    attention = m * s.decoder_attention_flops(positions, tokens, s.attention_layers(logits)) / rates.attention

    def gemms(min_m: int) -> float:
        return sum(count * rates.seconds("nbits", m, k, n, min_m) for (_, k, n), count in s.decoder_gemms(logits).items())

    weights = s.decoder.weight_bytes - (0 if logits else s.decoder.vocab_bytes)
    memory = (weights + rows * s.self_cache_bytes(positions) + s.cross_bytes) / (bandwidth * 1e9)
    return Limit(gemms(COMPUTE_M) + attention, memory, gemms(1) + attention)


def decoder_flops(s: Shapes, tokens: int, logits: bool, position: float) -> tuple[float, float, float]:
    """(linear, attention, vocabulary projection) FLOPs of a one-row call of ``tokens`` tokens at ``position``."""
    linear = sum(count * 2.0 * tokens * k * n for (_, k, n), count in s.decoder_gemms(logits).items() if n != s.vocab)
    attention = tokens * s.decoder_attention_flops(s.cache_positions(position), tokens, s.attention_layers(logits))
    return linear, attention, (2.0 * tokens * s.d * s.vocab if logits else 0.0)


# --- the measured split ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecoderCall:
    kind: str  # "step", "prompt" (previous text, no logits), "prefix" (from sot, logits), "alignment"
    rows: int
    tokens: int
    position: int  # the longest row's cache length before the call
    logits: bool
    seconds: float = 0.0
    cpu: float = 0.0  # the process's CPU seconds over the call (every thread's)


def describe_call(method: str, args: tuple, kwargs: dict) -> DecoderCall:
    """A decoder ``step(state, tokens, cross)``, ``forward(state, tokens, cross, need_logits)`` or ``score`` call:
    its part is a one-token step, the word-alignment pass (``score``, or a ``forward`` told by its caller), or the
    prompt before
    <|startoftranscript|> (no logits: it only fills the cache) and the prefix from it (logits)."""
    state, tokens = args[0], np.asarray(args[1])
    if method == "score_tokens":  # Decoder.score: the word-alignment pass, its scored rows projected
        return DecoderCall("alignment", tokens.shape[0], tokens.shape[1], int(state.lengths.max()), True)
    logits = method == "step" or bool(kwargs.get("need_logits", args[3] if len(args) > 3 else True))
    kind = "step" if method == "step" else "prefix" if logits else "prompt"
    if kind != "step" and ALIGNMENT_PASS[0]:
        kind = "alignment"
    count = tokens.shape[1] if tokens.ndim > 1 else 1
    return DecoderCall(kind, tokens.shape[0], count, int(state.lengths.max()), logits)


class SplitClock(ComponentClock):
    """``bench.ComponentClock`` that also keeps every outermost call's wall and process CPU seconds
    (``durations``, ``cpu``), describes each outermost decoder call (``DecoderCall``), and times the word
    timing's host work (``timing.find_alignment``: DTW and what it needs)."""

    METHODS = (*ComponentClock.METHODS, "word_timing")
    DECODER_METHODS = ("step", "forward_tokens", "score_tokens")

    def __init__(self, model):
        from whisperane import timing
        from whisperane.longform import words

        self.durations: dict[str, list[float]] = {name: [] for name in self.METHODS}
        self.cpu: dict[str, list[float]] = {name: [] for name in self.METHODS}
        self.decoder_calls: list[DecoderCall] = []
        super().__init__(model)
        self._timing, self._find_alignment = timing, timing.find_alignment
        timing.find_alignment = self._wrap("word_timing", timing.find_alignment)
        self._words, self._teacher_forced = words, words.teacher_forced

        def alignment_pass(*args, **kwargs):
            ALIGNMENT_PASS[0] = True
            try:
                return self._teacher_forced(*args, **kwargs)
            finally:
                ALIGNMENT_PASS[0] = False

        words.teacher_forced = alignment_pass

    def _wrap(self, name: str, fn):
        timed = super()._wrap(name, fn)

        def recorded(*args, **kwargs):
            outer = self._depth == 0
            call = describe_call(name, args, kwargs) if outer and name in self.DECODER_METHODS else None
            t0, cpu0 = time.perf_counter(), time.process_time()
            try:
                return timed(*args, **kwargs)
            finally:
                if outer:
                    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                    self.durations[name].append(seconds)
                    self.cpu[name].append(cpu)
                    if call is not None:
                        self.decoder_calls.append(replace(call, seconds=seconds, cpu=cpu))

        return recorded

    def reset(self) -> None:
        super().reset()
        self.durations = {name: [] for name in self.METHODS}
        self.cpu = {name: [] for name in self.METHODS}
        self.decoder_calls = []

    def remove(self) -> None:
        super().remove()
        self._timing.find_alignment = self._find_alignment
        self._words.teacher_forced = self._teacher_forced


@dataclass(frozen=True)
class Split:
    wall: float
    cpu_total: float
    durations: dict[str, list[float]]  # each outermost call's seconds, by method
    cpu: dict[str, list[float]]  # ... and the process's CPU seconds over it
    decoder_calls: list[DecoderCall]
    compute_type: str


def measure_split(bundle: Path, audio: str | np.ndarray, warmup: np.ndarray, threads: int, language: str | None) -> Split:
    """Transcribe ``audio`` once with a loaded model (after a warm-up call) and its component calls timed."""
    from whisperane import load_model
    from whisperane.transcribe import transcribe

    model = load_model(str(bundle), threads=threads)
    clock = SplitClock(model)
    try:
        transcribe(warmup, model, language=language)
        clock.reset()
        t0, cpu0 = time.perf_counter(), time.process_time()
        transcribe(audio, model, language=language)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        clock.remove()
    return Split(wall, cpu, clock.durations, clock.cpu, clock.decoder_calls, model.compute_type)


# --- output -----------------------------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.2f}" if seconds < 0.1 else f"{1000 * seconds:.0f}"


def percent(limit: float, measured: float) -> str:
    return f"{100 * limit / measured:.0f} %" if measured > 0 else "n/a"


def print_bandwidth(threads: int, repeats: int) -> tuple[float, float]:
    """The streaming-read table; returns the bandwidths at ``threads`` threads (GB/s) from DRAM (the memory
    limit) and from the last-level cache."""
    section("Machine limits: streaming-read bandwidth")
    counts = sorted({1, threads})
    rows, found = [], []
    for mib, label in ((READ_MIB, "DRAM (beyond the last-level cache)"), (CACHED_MIB, "last-level cache")):
        rates = [read_bandwidth(mib, t, repeats) for t in counts]
        rows.append([f"{mib} MiB float32", label, *(f"{r:.1f}" for r in rates)])
        found.append(rates[-1])
        progress(f"read {mib} MiB: {', '.join(f'{r:.1f}' for r in rates)} GB/s")
    dram, cached = found
    emit("numpy's max over a float32 array (a SIMD reduction, no BLAS), T threads reading T parts at once, best "
         f"of {repeats}. The memory limits below use the DRAM figure at {threads} thread(s): {dram:.1f} GB/s.\n")
    emit(table(["array", "where it lives", *(f"GB/s, {t} thread{'s' * (t > 1)}" for t in counts)], rows))
    return dram, cached


def print_probes(s: Shapes, rates: Rates, threads: int) -> None:
    emit(f"\n### GEMM throughput (ONNX Runtime, {threads} threads, best run)\n")
    emit("One-operation graphs at the model's shapes. int8: the encoder's DynamicQuantizeLinear + MatMulInteger "
         "+ scale pattern, which ONNX Runtime fuses into DynamicQuantizeMatMul (input quantization included; in "
         "the encoder q, k and v share one quantization: MatMulIntegerToFloat); attention: the QK^T and AV products as "
         "MatMuls (the encoder runs them inside ONNX Runtime's MultiHeadAttention, the decoder as FusedMatMul); nbits: the decoder's MatMulNBits; int8 at d->V: not a kernel the decoder runs, the rate its vocabulary "
         "projection would have as a per-token int8 MatMul (7-bit weights, as AVX2's u8 x s8 pair sums need); GB/s: weights "
         "(stored precision, with scales) and float32 input over the best time; cold: a 128 MiB read between "
         f"runs evicts the weights first. Times are net of one empty `session.run` ({1e6 * rates.overhead:.0f} us, "
         "an Identity graph).\n")
    rows = []
    for p, seconds in rates.best.items():
        shape = f"{p.batch} x " if p.batch > 1 else ""
        gbs = p.bytes_read / seconds / 1e9 if p.bytes_read else None
        rows.append([KERNELS[p.kind] + (" (cold)" if p.cold else ""), gemm_role(s, p.k, p.n) if p.kind in
                     ("float32", "int8", "nbits") else "", f"{shape}{p.m} x {p.k} x {p.n}", f"{p.flops / 1e9:.3f}",
                     ms(seconds), f"{p.flops / seconds / 1e9:.1f}", f"{gbs:.1f}" if gbs else ""])
    emit(table(["kernel", "role", "M x K x N", "GFLOP", "best ms", "GFLOP/s", "GB/s"], rows))


def print_encoder_work(s: Shapes, rates: Rates) -> float:
    """The encoder window's FLOPs and its limit (seconds): each operation at its probe's time."""
    emit("\n### Work of one encoder window (int8 encoder)\n")
    rows, flops, limit = [], 0.0, 0.0
    for label, p, count in encoder_ops(s):
        flops, limit = flops + count * p.flops, limit + count * rates.best[p]
        rows.append([label, count, f"{count * p.flops / 1e9:.2f}", f"{p.flops / rates.best[p] / 1e9:.1f}",
                     ms(count * rates.best[p])])
    rows.append(["**total**", "", f"**{flops / 1e9:.2f}**", f"{flops / limit / 1e9:.1f}", f"**{ms(limit)}**"])
    emit(table(["operation", "count", "GFLOP", "probed GFLOP/s", "ms at that rate"], rows))
    emit("\nThe limit counts the convs, GEMMs and attention products only (not softmax, GELU, LayerNorm, "
         "transposes); the float32/int8 split is read from the bundle's AudioEncoder.int8.onnx.")
    return limit


def print_decoder_work(s: Shapes, rates: Rates, bandwidths: tuple[float, float], calls: Sequence[DecoderCall]) -> None:
    bandwidth, cached = bandwidths
    steps = [c for c in calls if c.kind == "step"]
    position = sum(c.position for c in steps) / max(len(steps), 1)
    held = statistics.mean(s.cache_positions(c.position) for c in steps) if steps else s.cache
    total = s.decoder.weight_bytes + s.self_cache_bytes(held) + s.cross_bytes
    emit("\n### Bytes one decoder step reads (int8 TextDecoderSequence, one row)\n")
    items = [
        ("weights: all initializers of TextDecoderSequence.int8.onnx", s.decoder.weight_bytes),
        ("... of which the vocabulary projection (tied embedding: 8-bit + block scales)", s.decoder.vocab_bytes),
        (f"self-attention K/V caches as the state holds them (the run's mean: {held:.0f} of S = {s.cache} positions, "
         f"those reached rounded up to blocks of {CAPACITY_BLOCK}; the step attends over all it holds)", s.self_cache_bytes(held)),
        (f"... the part filled at the run's mean step position ({position:.0f})", 2 * s.decoder_layers * s.d * position * FLOAT),
        (f"cross-attention K/V (float32 [1, {s.d}, 1, {s.frames}], K and V, {s.decoder_layers} layers)", s.cross_bytes),
    ]
    rows = [[label, f"{size / MB:.1f}"] for label, size in items]
    rows.append(["**total read** (weights, caches as held, cross K/V)", f"**{total / MB:.1f}**"])
    rows.append([f"at {bandwidth:.1f} GB/s (DRAM, the memory limit of a step), ms", ms(total / (bandwidth * 1e9))])
    rows.append([f"at {cached:.1f} GB/s (were it all in the last-level cache), ms", ms(total / (cached * 1e9))])
    emit(table(["decoder step reads", "MB"], rows))
    emit("\n### FLOPs of the decoder calls (one row)\n")
    cases = [("previous-text prompt, longest (cache only, no logits)", PROMPT_TOKENS, False, 0)]
    for kind, label in (("prompt", "previous-text prompt, mean of the run"), ("prefix", "prefix from sot, mean of the run"),
                        ("alignment", "word-alignment pass, mean of the run")):
        of_kind = [c for c in calls if c.kind == kind]
        if of_kind:
            cases.append((label, round(statistics.mean(c.tokens for c in of_kind)), of_kind[0].logits,
                          statistics.mean(c.position for c in of_kind)))
    cases.append(("one-token step", 1, True, position))
    rows = []
    for label, tokens, logits, at in cases:
        linear, attention, vocab = decoder_flops(s, tokens, logits, at)
        limit = decoder_limit(s, rates, bandwidth, 1, tokens, logits, at)
        rows.append([label, tokens, f"{linear / 1e9:.3f}", f"{attention / 1e9:.3f}", f"{vocab / 1e9:.3f}",
                     f"{(linear + attention + vocab) / 1e9:.3f}", ms(limit.compute), ms(limit.memory),
                     f"{ms(limit.seconds)} ({limit.bound})", ms(limit.kernels)])
    emit(table(["call", "tokens", "GFLOP linear", "GFLOP attention", "GFLOP vocabulary", "GFLOP total",
                "compute ms", "memory ms", "limit ms", "ORT kernels alone ms"], rows))
    emit(f"\nCompute: the MatMulNBits at the rate of the probe of nearest M among M >= {COMPUTE_M} (compute-bound), "
         "attention at the encoder QK^T's float32 rate. Memory: the bytes above at the DRAM bandwidth (without the "
         "vocabulary projection when no logits are asked for: the graph skips it, given no logit_positions). The limit is the "
         "larger. ORT kernels alone: the probes at the nearest M, small M included (what the kernels reach on "
         "their own, one call each).")


@dataclass(frozen=True)
class Part:
    """One part of the split: its calls' durations, and each call's limit and ORT-kernels time where it has one."""

    label: str
    durations: Sequence[float]
    cpu: Sequence[float] = ()
    tokens: str = ""
    limits: Sequence[Limit] = ()

    def row(self, windows: int, wall: float) -> list[object]:
        d, total = self.durations, sum(self.durations)
        cells = [self.label, len(d) or "", self.tokens,
                 f"{ms(total / len(d))} / {ms(statistics.median(d))}" if d else "",
                 ms(statistics.median(self.cpu)) if self.cpu else "", ms(total / windows)]
        if self.limits:
            limit = sum(lim.seconds for lim in self.limits)
            bound = Counter(lim.bound for lim in self.limits).most_common(1)[0][0]
            median = statistics.median(lim.seconds / t for lim, t in zip(self.limits, d, strict=True))
            cells += [f"{ms(limit / len(d))} ({bound})", f"{percent(limit, total)} / {100 * median:.0f} %",
                      ms(sum(lim.kernels for lim in self.limits) / len(d))]
        else:
            cells += ["", "", ""]
        return [*cells, f"{total:.2f}", f"{100 * total / wall:.0f} %"]


def split_parts(s: Shapes, split: Split, encoder_limit: float, rates: Rates, bandwidth: float) -> list[Part]:
    t, cpu = split.durations, split.cpu
    parts = [Part("mel (log_mel, with the file-peak pass)", t["log_mel"], cpu["log_mel"]),
             Part("encoder", t["encode"], cpu["encode"], limits=[Limit(encoder_limit, 0.0, encoder_limit)] * len(t["encode"]))]
    labels = {"step": "decoder one-token step", "prompt": "decoder: previous-text prompt (no logits)",
              "prefix": "decoder: prefix from sot (logits)", "alignment": "decoder: word-alignment pass (logits)"}
    for kind, label in labels.items():
        calls = [c for c in split.decoder_calls if c.kind == kind]
        if calls:
            tokens = f"{statistics.mean(c.tokens for c in calls):.0f}"
            if kind == "step":
                tokens += f" (position {statistics.mean(c.position for c in calls):.0f})"
            limits = [decoder_limit(s, rates, bandwidth, c.rows, c.tokens, c.logits, c.position) for c in calls]
            parts.append(Part(label, [c.seconds for c in calls], [c.cpu for c in calls], tokens, limits))
    parts.append(Part("word timing on the host (find_alignment: DTW)", t["word_timing"], cpu["word_timing"]))
    rest = split.wall - sum(sum(part.durations) for part in parts)
    return [*parts, Part("rest (audio decoding, logit filters, segments, Python)", [rest])]


def print_split(s: Shapes, split: Split, encoder_limit: float, rates: Rates, bandwidth: float, duration: float) -> None:
    windows, wall = max(len(split.durations["encode"]), 1), split.wall
    emit(f"\n### Measured split ({duration:.0f} s of audio, {split.compute_type}, {windows} windows)\n")
    rows = [part.row(windows, wall) for part in split_parts(s, split, encoder_limit, rates, bandwidth)]
    rows[-1][1:5] = ["", "", "", ""]  # the rest is no call
    rows.append(["**total**", "", "", "", "", ms(wall / windows), "", "", "", f"**{wall:.2f}** (CPU {split.cpu_total:.2f})",
                 f"RTF {wall / duration:.3f}"])
    emit(table(["part", "calls", "tokens per call", "ms per call: mean / median", "CPU ms per call: median", "ms per window",
                "limit ms per call", "% of limit: total / median call", "ORT kernels alone ms per call", "s",
                "share of wall"], rows))
    emit("\n% of limit: the limit's time over the measured time (100 % = at the roofline), for all calls together "
         "and for the median call (less disturbed by other load on the machine). CPU: this process's user + "
         "system seconds over a call or the transcription (ONNX Runtime's threads included, their spinning too; "
         "with one thread, the steadier figure on a loaded machine: time waiting for a core is not counted).")


# --- main --------------------------------------------------------------------------------------------------------------


def run_model(name: str, args: argparse.Namespace, bandwidths: tuple[float, float], audio: str | np.ndarray,
              warmup: np.ndarray, duration: float) -> None:
    from whisperane.loading import resolve_bundle

    bundle = resolve_bundle(name).resolve()
    s = Shapes.of_bundle(bundle)
    flush = np.ones(FLUSH_MIB * 2**20 // FLOAT, dtype=np.float32)
    overhead = time_probe(Probe("identity", 1, s.d, s.d), args.threads, RUN_OVERHEAD_REPEATS, flush)
    best = {p: time_probe(p, args.threads, args.repeats, flush, overhead) for p in probes_for(s)}
    del flush
    progress(f"{name}: {len(best)} probes")
    rates = Rates(best, overhead)
    split = measure_split(bundle, audio, warmup, args.threads, Bench.fixed_language(name))
    progress(f"{name}: transcribed in {split.wall:.1f} s")
    section(f"{name} (d = {s.d}, {s.encoder_layers} + {s.decoder_layers} layers)")
    print_probes(s, rates, args.threads)
    encoder_limit = print_encoder_work(s, rates)
    print_decoder_work(s, rates, bandwidths, split.decoder_calls)
    print_split(s, split, encoder_limit, rates, bandwidths[0], duration)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny.en,base", help="comma-separated model names")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime threads, and threads of the read probe")
    p.add_argument("--long", default=None, help="the audio file (default: the >= 10-minute English file bench.py builds)")
    p.add_argument("--quick", action="store_true", help=f"only the file's first {QUICK_SECONDS} s; 3 runs per probe")
    p.add_argument("--repeats", type=int, default=None, help="runs per probe, the best kept (default 7, 3 with --quick)")
    p.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"), help="for the default long file")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "whisperane" / "bench"), help="where it is built")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 7)
    if args.long:
        path = Path(args.long)
    else:
        english = [c for c in load_corpus(Path(args.corpus)) if c.language == "en"]
        path = build_long_file(english, LONG_SECONDS, Path(args.cache)).path
    samples = read_16k_mono(path)
    if args.quick:
        samples = samples[: QUICK_SECONDS * SAMPLE_RATE]
    duration = len(samples) / SAMPLE_RATE
    t0 = time.perf_counter()
    header(args)
    emit(f"- roofline (bench_roofline.py): {path.name}, {duration:.0f} s{' (its start)' if args.quick else ''}; "
         f"best of {args.repeats} runs per probe")
    bandwidths = print_bandwidth(args.threads, args.repeats)
    for name in (m.strip() for m in args.models.split(",") if m.strip()):
        run_model(name, args, bandwidths, samples if args.quick else str(path), samples[: WARMUP_SECONDS * SAMPLE_RATE], duration)
    emit(f"\n_finished in {(time.perf_counter() - t0) / 60:.1f} min; load average at end: {loadavg()}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
