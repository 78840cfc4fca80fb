"""Each component's kernel paths timed under each CPU kind's kernels (issue 62): the per-CPU choice shown by the
kernels' own timings.

For every model and every view of ONNX Runtime (``native``: this CPU's kernels; ``avx2vnni`` and ``avx2``: the
copies ``isa_views.py`` makes, whose MLAS runs the kernels of a CPU without AVX-512, and without AVX-VNNI), each
component variant of the bundle is run on its own graph, one thread, on inputs of the shapes a transcription
gives it, and timed in CPU time (``time.process_time``: the steadier figure on a shared machine, where a wall
clock counts the time waiting for a core):

- the encoder, one 30 s window: ``AudioEncoder.int8.onnx`` (dynamic int8 MatMulInteger) and ``AudioEncoder.onnx``;
- a decoder step (one token at cache position 100, logits) and a 100-token decoder call (a previous-text prompt or
  the word-alignment pass): ``TextDecoderSequence.int8.onnx`` (MatMulNBits, 8 bits, accuracy level 4) and
  ``TextDecoderSequence.onnx`` (float32), and with ``--dynamic-decoder`` the float32 decoder dynamically quantized
  as the encoder is (built once into the cache; a candidate, not a bundle component).

    python benchmarks/isa_views.py && python benchmarks/bench_kernels.py [--models tiny.en,base] [--dynamic-decoder]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import loadavg  # noqa: E402
from isa_views import DEFAULT_OUT, VIEWS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE_POSITIONS, POSITION = 448, 100
RUNS = {"encoder": 5, "step": 200, "call": 15}


def feeds_for(session, tokens: int, dims: dict) -> dict[str, np.ndarray]:
    """Inputs of a decoder call of ``tokens`` tokens at cache position POSITION (any graph's interface)."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for i in session.get_inputs():
        n, shape = i.name, i.shape
        if n == "input_ids":
            feeds[n] = np.full((1, tokens), 440, np.int32)
        elif n == "cache_length":
            feeds[n] = np.array([POSITION], np.int32)
        elif n.startswith(("key_cache", "value_cache", "encoder_attn")):
            last = 1500 if n.startswith("encoder") else CACHE_POSITIONS
            feeds[n] = (rng.standard_normal((1, shape[1], 1, last)) * 0.1).astype(np.float32)
        elif n == "decoder_key_padding_mask":
            mask = np.full((1, CACHE_POSITIONS), -1e4, np.float32)
            mask[0, : POSITION + tokens] = 0
            feeds[n] = mask
        elif n == "logit_positions":  # logits of the last position for a step, none for a prompt
            feeds[n] = np.array([0], np.int32) if tokens == 1 else np.zeros(0, np.int32)
        elif n in ("logprob_positions", "logprob_tokens"):
            feeds[n] = np.zeros((0,) if n == "logprob_positions" else (1, 0), np.int32)
        elif n == "token_embeddings":
            feeds[n] = (rng.standard_normal((1, tokens, dims["n_text_state"])) * 0.1).astype(np.float32)
        else:
            raise SystemExit(f"bench_kernels: unknown input {n}")
    return feeds


def cpu_ms(path: Path, feeds_of, runs: int) -> float:
    """Median CPU time of one run, one thread, after one run not counted."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = feeds_of(session)
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.process_time()
        session.run(None, feeds)
        times.append(time.process_time() - t)
    return 1000 * statistics.median(times)


def variants(bundle: Path, dynamic: Path | None) -> list[tuple[str, str, Path, int]]:
    """(component, variant, graph, tokens: 0 for the encoder)."""
    out = [("encoder, a 30 s window", "int8: dynamic MatMulInteger", bundle / "AudioEncoder.int8.onnx", 0),
           ("encoder, a 30 s window", "float32", bundle / "AudioEncoder.onnx", 0)]
    decoders = [("int8: MatMulNBits, accuracy 4", bundle / "TextDecoderSequence.int8.onnx"),
                ("float32", bundle / "TextDecoderSequence.onnx")]
    if dynamic is not None:
        decoders.append(("int8: dynamic MatMulInteger (candidate)", dynamic))
    for tokens, component in ((1, f"decoder step at position {POSITION}"), (100, "decoder, a 100-token call")):
        out += [(component, name, path, tokens) for name, path in decoders]
    return out


def child(models: list[str], dynamic: bool, cache: Path) -> None:
    """Under one view: every variant's CPU ms, as JSON lines."""
    for model in models:
        bundle = ROOT / "models" / model
        dims = json.loads((bundle / "config.json").read_text())["dims"]
        for component, name, path, tokens in variants(bundle, dynamic_decoder(bundle, cache) if dynamic else None):
            if tokens == 0:
                mel = (np.random.default_rng(0).standard_normal((1, dims["n_mels"], 1, 3000)) * 0.3).astype(np.float32)
                ms = cpu_ms(path, lambda s, mel=mel: {s.get_inputs()[0].name: mel}, RUNS["encoder"])
            else:
                ms = cpu_ms(path, lambda s, t=tokens, d=dims: feeds_for(s, t, d), RUNS["step" if tokens == 1 else "call"])
            print(json.dumps({"model": model, "component": component, "variant": name, "ms": ms}), flush=True)


def dynamic_decoder(bundle: Path, cache: Path) -> Path:
    """The float32 decoder with ONNX Runtime's dynamic int8 quantization (7-bit weights per channel), built once."""
    out = cache / f"{bundle.name}.TextDecoderSequence.dynamic-int8.onnx"
    if not out.exists():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        cache.mkdir(parents=True, exist_ok=True)
        quantize_dynamic(str(bundle / "TextDecoderSequence.onnx"), str(out), weight_type=QuantType.QInt8,
                         per_channel=True, reduce_range=True, op_types_to_quantize=["MatMul", "Gemm"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--views", default="native," + ",".join(VIEWS), help=f"native and views under {DEFAULT_OUT}")
    p.add_argument("--views-dir", type=Path, default=DEFAULT_OUT)
    p.add_argument("--dynamic-decoder", action="store_true", help="also the dynamically quantized decoder")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "whisperane" / "bench")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    models = args.models.split(",")
    if args.child:
        return child(models, args.dynamic_decoder, args.cache)
    rows: dict[tuple[str, str, str], dict[str, float]] = {}
    views = args.views.split(",")
    print(f"load average at start: {loadavg()}\n")
    for view in views:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            ([] if view == "native" else [str(args.views_dir / view)]) + [str(ROOT)]))
        cmd = [sys.executable, __file__, "--child", "--models", args.models, "--cache", str(args.cache)]
        lines = subprocess.run(cmd + (["--dynamic-decoder"] if args.dynamic_decoder else []), env=env, check=True,
                               capture_output=True, text=True).stdout.splitlines()
        for line in lines:
            r = json.loads(line)
            rows.setdefault((r["model"], r["component"], r["variant"]), {})[view] = r["ms"]
    print("| model | component | kernel path | " + " | ".join(f"{v} CPU ms" for v in views) + " |")
    print("|---|---|---|" + "---|" * len(views))
    for (model, component, variant), ms in rows.items():
        best = {v: min(t[v] for (m, c, _), t in rows.items() if m == model and c == component) for v in views}
        cells = [f"**{ms[v]:.2f}**" if ms[v] == best[v] else f"{ms[v]:.2f}" for v in views]
        print(f"| {model} | {component} | {variant} | " + " | ".join(cells) + " |")
    print(f"\nBold: the fastest path of a component under that view. Load average at end: {loadavg()}")


if __name__ == "__main__":
    main()
