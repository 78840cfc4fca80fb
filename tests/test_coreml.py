"""Core ML export (whisperane/convert/export_coreml.py) of a seeded random Whisper (COREML_RANDOM).

Everywhere: the packages are built once per session and their specs are checked against the component
contract (docs/DESIGN.md §2): names, shapes, dtypes and states, ML Program type, deployment targets, compute
precision, palettized weights only on request; the decoders' batch of rows (the stateless TextDecoder's
range, the beam package's 5 rows and states) over batch-1 cross K/V that reach the attention unchanged (no op
between them and the matmuls can copy them to the rows); the stateful decoder wrapper is checked in torch
(eager and traced, the graph Core ML receives) against the stateless decoder with host-side cache writes, at 1
and 5 rows; and the runtime's stateful adapter (runtime.coreml.StatefulDecoder: MLState rows, prefix copies, beam
reordering) runs a beam walk over the torch wrapper standing in for Core ML, against the ONNX float32 decoder
exported from the same weights. On macOS also: each package's predictions against its torch module (PSNR >= 35
dB), and the beam walk through the Core ML decoders against the ONNX float32 one. The real models' Core ML
conversion runs where a user asks for it (``whisperane convert tiny.en --formats coreml``); these checks are about the
export's code, which a random model of fewer layers exercises in a quarter of the time.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from reference import psnr

torch = pytest.importorskip("torch")
ct = pytest.importorskip("coremltools")

from whisperane.audio import load_audio, pad_or_trim  # noqa: E402
from whisperane.contract import MASK_VALUE  # noqa: E402
from whisperane.convert import export_coreml, modules  # noqa: E402
from whisperane.convert.checkpoint import load_checkpoint  # noqa: E402
from whisperane.convert.export_onnx import decoder_example, export_decoder  # noqa: E402
from whisperane.convert.prefill import compute_prefill_table  # noqa: E402
from whisperane.dims import ModelDimensions  # noqa: E402
from whisperane.runtime.coreml import CoreMLComponent, StatefulDecoder  # noqa: E402
from whisperane.runtime.decoder_adapters import CrossAttention, OneHotDecoder  # noqa: E402
from whisperane.runtime.executors import OnnxComponent  # noqa: E402
from whisperane.runtime.state import CacheLayout  # noqa: E402

pytestmark = pytest.mark.slow

S = 448  # the default cache length, as the pipeline converts it
PALETTE_BITS = 4
JFK = Path(__file__).parent / "data" / "jfk.flac"
macos_only = pytest.mark.skipif(
    sys.platform != "darwin",
    reason="Core ML runtime (predict) exists only on macOS; Linux builds and checks the specs",
)


# --- one build per session --------------------------------------------------------------------------------

# tiny.en's vocabulary, mel bins, frames and cache length; one encoder layer and two decoder layers of width 192
# (heads of 64, as tiny.en's; every weight matrix above the palettization threshold, as in real models): every
# path of the export (layers concatenated and sliced, the tied embedding, alignment heads, rows and states) at a
# fraction of tiny.en's operations, whose conversion through coremltools' passes took 85 s (and 19 s more
# palettized) of the CI's 2 cores.
COREML_RANDOM = ModelDimensions(
    n_mels=80, n_audio_ctx=1500, n_audio_state=192, n_audio_head=3, n_audio_layer=1,
    n_vocab=51864, n_text_ctx=448, n_text_state=192, n_text_head=3, n_text_layer=2,
)


@pytest.fixture(scope="session")
def random_checkpoint(tmp_path_factory):
    """COREML_RANDOM as a seeded Hugging Face checkpoint; weights drawn wider than transformers' default
    (std 0.1, not 0.02) so that rows with different tokens get clearly different logits."""
    from conftest import hf_config
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(hf_config(COREML_RANDOM, init_std=0.1)).eval()
    path = tmp_path_factory.mktemp("coreml_random") / "whisper"
    model.save_pretrained(path, safe_serialization=True)
    return load_checkpoint(path)


@pytest.fixture(scope="session")
def torch_modules(random_checkpoint):
    """The torch modules the packages are exported from, and one real window (JFK) through them.

    The prefill table is computed from that window's cross K/V, not from the pipeline's eight noise windows
    (convert.prefill.random_encoder_outputs): the packages hold whatever table they are given, and these tests
    check its shapes and that Core ML returns it."""
    torch.set_grad_enabled(False)
    ckpt = random_checkpoint
    dims = ckpt.dims
    mel, encoder = modules.MelSpectrogram(dims.n_mels).eval(), modules.build_encoder(ckpt, sdpa="chunked")
    audio = torch.from_numpy(pad_or_trim(load_audio(str(JFK))).astype(np.float32))
    features = mel(audio)
    embeds, enc_k, enc_v = encoder(features)
    sequence = modules.build_decoder(ckpt, modules.TextDecoderSequence)
    key_table, value_table = compute_prefill_table(sequence, enc_k, enc_v, 50257, [], [], S)
    assert dims == COREML_RANDOM
    return {
        "dims": dims,
        "checkpoint": ckpt,
        "mel": mel,
        "encoder": encoder,
        "decoder": modules.build_decoder(ckpt, modules.TextDecoder),
        "prefill": modules.TextDecoderContextPrefill(key_table, value_table, 0, 1),
        "window": {"audio": audio, "mel": features, "embeds": embeds, "enc_k": enc_k, "enc_v": enc_v},
    }


def _export(out: Path, m: dict, **kwargs) -> dict:
    return export_coreml.export_all(
        out,
        m["dims"],
        S,
        mel=m["mel"],
        encoder=m["encoder"],
        decoder=m["decoder"],
        prefill=m["prefill"],
        **kwargs,
    )


@pytest.fixture(scope="session")
def bundle(tmp_path_factory, torch_modules) -> tuple[Path, dict]:
    """Every package, no palettization requested."""
    out = tmp_path_factory.mktemp("coreml")
    return out, _export(out, torch_modules)


@pytest.fixture(scope="session")
def palettized(tmp_path_factory, torch_modules, bundle) -> tuple[Path, dict]:
    """The encoder with palettization requested: the cheapest component that exercises the path. export_all
    runs as it is, but its encoder conversion returns the ``bundle``'s AudioEncoder package (the same function
    on the same module): the second conversion took 10 to 40 s at load 12 on the 2-core machine."""
    out = tmp_path_factory.mktemp("coreml_palettized")
    converted = ct.models.MLModel(str(bundle[0] / "AudioEncoder.mlpackage"), skip_model_load=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export_coreml, "convert_encoder", lambda encoder, dims: converted)
        return out, _export(out, torch_modules, palettize=PALETTE_BITS, packages=["AudioEncoder"])


# --- spec helpers -----------------------------------------------------------------------------------------

ARRAY_TYPES = ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType


def _features(feats) -> dict[str, tuple[str, list[int]]]:
    out = {}
    for f in feats:
        kind = f.type.WhichOneof("Type")
        array = f.type.stateType.arrayType if kind == "stateType" else f.type.multiArrayType
        out[f.name] = (ARRAY_TYPES.Name(array.dataType), list(array.shape))
    return out


def _spec(path: Path):
    return ct.utils.load_spec(str(path))


def _operations(spec) -> list:
    fn = spec.mlProgram.functions["main"]
    return [op for block in fn.block_specializations.values() for op in block.operations]


def _tensor_dtypes(spec) -> set[str]:
    """Element types of every op output in the program (tells fp16 compute from fp32)."""
    names = ct.proto.MIL_pb2.DataType
    return {
        names.Name(o.type.tensorType.dataType)
        for op in _operations(spec)
        for o in op.outputs
        if o.type.WhichOneof("type") == "tensorType"
    }


def _large_consts(spec) -> int:
    """Constant tensors with more elements than the palettization threshold (coremltools' rule)."""
    n = 0
    for op in _operations(spec):
        if op.type == "const":
            t = op.attributes["val"].type.tensorType
            size = int(np.prod([d.constant.size for d in t.dimensions])) if t.rank else 1
            n += size > export_coreml.PALETTIZE_WEIGHT_THRESHOLD
    return n


def _contract(dims, alignment_heads: int) -> dict:
    """The contract's tensors at batch 1 (docs/DESIGN.md §2), written out independently of the exporter."""
    d, dl, f, v = dims.n_audio_state, dims.n_text_state * dims.n_text_layer, dims.n_audio_ctx, dims.n_vocab
    f32 = "FLOAT32"
    return {
        "MelSpectrogram": (
            {"audio": (f32, [480000])},
            {"melspectrogram_features": (f32, [1, dims.n_mels, 1, 3000])},
        ),
        "AudioEncoder": (
            {"melspectrogram_features": (f32, [1, dims.n_mels, 1, 3000])},
            {
                "encoder_output_embeds": (f32, [1, d, 1, f]),
                "encoder_attn_key_cache": (f32, [1, dl, 1, f]),
                "encoder_attn_value_cache": (f32, [1, dl, 1, f]),
            },
        ),
        "TextDecoder": (
            {
                "input_ids": ("INT32", [1]),
                "cache_length": ("INT32", [1]),
                "key_cache": (f32, [1, dl, 1, S]),
                "value_cache": (f32, [1, dl, 1, S]),
                "kv_cache_update_mask": (f32, [1, S]),
                "decoder_key_padding_mask": (f32, [1, S]),
                "encoder_attn_key_cache": (f32, [1, dl, 1, f]),
                "encoder_attn_value_cache": (f32, [1, dl, 1, f]),
            },
            {
                "logits": (f32, [1, 1, v]),
                "key_cache_updates": (f32, [1, dl, 1, 1]),
                "value_cache_updates": (f32, [1, dl, 1, 1]),
                "alignment_heads_weights": (f32, [1, alignment_heads, f]),
            },
        ),
        "TextDecoderContextPrefill": (
            {"task": ("INT32", [1]), "language": ("INT32", [1])},
            # P = 1: an English-only model's forced prefix is sot alone
            {"key_cache_prefill": (f32, [1, dl, 1, 1]), "value_cache_prefill": (f32, [1, dl, 1, 1])},
        ),
    }


# --- specs (every platform) -------------------------------------------------------------------------------


def test_export_all_lists_every_package_it_wrote(bundle):
    out, components = bundle
    assert components == {
        "MelSpectrogram": {"coreml": "MelSpectrogram.mlpackage"},
        "AudioEncoder": {"coreml": "AudioEncoder.mlpackage"},
        "TextDecoder": {
            "coreml": "TextDecoder.mlpackage",
            "coreml_stateful": "TextDecoderStateful.mlpackage",
            "coreml_stateful_beam": "TextDecoderStatefulBeam.mlpackage",
        },
        "TextDecoderContextPrefill": {"coreml": "TextDecoderContextPrefill.mlpackage"},
    }
    assert sorted(p.name for p in out.iterdir()) == sorted(
        n for kinds in components.values() for n in kinds.values()
    )
    for name in (
        "MelSpectrogram",
        "AudioEncoder",
        "TextDecoder",
        "TextDecoderStateful",
        "TextDecoderStatefulBeam",
        "TextDecoderContextPrefill",
    ):
        assert (out / f"{name}.mlpackage" / "Manifest.json").is_file()


@pytest.mark.parametrize(
    "component", ["MelSpectrogram", "AudioEncoder", "TextDecoder", "TextDecoderContextPrefill"]
)
def test_stateless_package_matches_the_contract(bundle, torch_modules, component):
    """Names, order and dtypes; shapes at batch 1 (the TextDecoder's default shape: its outputs' shapes follow
    its batch, so the package leaves them open)."""
    out, _ = bundle
    spec = _spec(out / f"{component}.mlpackage")
    inputs, outputs = _contract(torch_modules["dims"], len(torch_modules["decoder"].alignment_heads))[component]
    assert spec.WhichOneof("Type") == "mlProgram"
    assert spec.specificationVersion == 7  # Core ML 6: macOS 13 / iOS 16
    assert _features(spec.description.input) == inputs
    assert [f.name for f in spec.description.input] == list(inputs)  # the ONNX argument order
    if component == "TextDecoder":
        outputs = {n: (t, []) for n, (t, _) in outputs.items()}
    assert _features(spec.description.output) == outputs
    assert [f.name for f in spec.description.output] == list(outputs)
    assert len(spec.description.state) == 0


@pytest.mark.parametrize("package, rows", [("TextDecoderStateful", 1), ("TextDecoderStatefulBeam", 5)])
def test_stateful_decoder_keeps_the_caches_in_state(bundle, torch_modules, package, rows):
    """Every per-row input, output and state at the package's fixed rows; the cross K/V at batch 1."""
    out, _ = bundle
    spec = _spec(out / f"{package}.mlpackage")
    inputs, outputs = _contract(torch_modules["dims"], len(torch_modules["decoder"].alignment_heads))["TextDecoder"]
    dl = torch_modules["dims"].n_text_state * torch_modules["dims"].n_text_layer
    assert rows == {"TextDecoderStateful": 1, "TextDecoderStatefulBeam": export_coreml.BEAM_BATCH}[package]

    def at_rows(features: dict) -> dict:
        per_row = lambda name, shape: shape if name.startswith("encoder_") else [rows, *shape[1:]]  # noqa: E731
        return {n: (t, per_row(n, shape)) for n, (t, shape) in features.items()}

    assert spec.WhichOneof("Type") == "mlProgram"
    assert spec.specificationVersion == 9  # Core ML 8: macOS 15 / iOS 18, the first with MLState
    assert _features(spec.description.input) == at_rows(
        {n: t for n, t in inputs.items() if n not in ("key_cache", "value_cache")}
    )
    assert _features(spec.description.output) == at_rows(
        {n: outputs[n] for n in ("logits", "alignment_heads_weights")}
    )
    assert _features(spec.description.state) == {
        "key_cache": ("FLOAT16", [rows, dl, 1, S]),
        "value_cache": ("FLOAT16", [rows, dl, 1, S]),
    }
    ops = Counter(op.type for op in _operations(spec))
    assert ops["read_state"] == 2 and ops["write_state"] == 2  # each cache read once and written back once


def _ranges(feature) -> list[tuple[int, int]]:
    """(lowest, highest) size of each dimension of an input; a fixed dimension is (n, n)."""
    array = feature.type.multiArrayType
    ranges = list(array.shapeRange.sizeRanges)
    return [(r.lowerBound, r.upperBound) for r in ranges] if ranges else [(d, d) for d in array.shape]


def _dims(value) -> list:
    """A MIL value's dimensions, '?' where the program leaves one open (a flexible batch)."""
    dims = value.type.tensorType.dimensions
    return [d.constant.size if d.WhichOneof("dimension") == "constant" else "?" for d in dims]


def test_stateless_decoder_takes_1_to_8_rows_over_cross_kv_of_batch_1(bundle, torch_modules):
    """Every per-row input takes B in 1..8 (beam 5 included), the cross K/V batch 1 (or up to 8 windows); the
    program's outputs have B rows and the contract's other dimensions."""
    out, _ = bundle
    dims = torch_modules["dims"]
    spec = _spec(out / "TextDecoder.mlpackage")
    inputs, outputs = _contract(dims, len(torch_modules["decoder"].alignment_heads))["TextDecoder"]
    most = export_coreml.MAX_DECODER_BATCH
    assert most >= 5
    for feature in spec.description.input:
        default = inputs[feature.name][1]
        assert _ranges(feature) == [(1, most), *((d, d) for d in default[1:])], feature.name
    produced = {o.name: _dims(o) for op in _operations(spec) for o in op.outputs}
    for name, (_, shape) in outputs.items():
        assert produced[name] == ["?", *shape[1:]], name


# ops that move a tensor's values without adding any (a K/V tensor through them keeps its batch and size)
DATA_MOVES = {"cast", "slice_by_index", "reshape", "transpose", "squeeze", "expand_dims", "split"}


def _bound_names(argument) -> list[str]:
    return [b.name for b in argument.arguments if b.WhichOneof("binding") == "name"]


def _cross_kv_path(spec) -> Counter:
    """The ops the cross K/V inputs flow through up to the attention matmuls, by type. Ops come in program
    order (producers first); a ``shape`` op reads only the shape, so the walk does not follow it."""
    path = {"encoder_attn_key_cache", "encoder_attn_value_cache"}
    kinds: Counter = Counter()
    for op in _operations(spec):
        if op.type == "shape" or not any(path & set(_bound_names(arg)) for arg in op.inputs.values()):
            continue
        kinds[op.type] += 1
        if op.type != "matmul":  # the scores and the attention output are per row, no longer K/V
            path |= {o.name for o in op.outputs}
    return kinds


@pytest.mark.parametrize("package", ["TextDecoder", "TextDecoderStateful", "TextDecoderStatefulBeam"])
def test_cross_kv_reach_the_attention_without_copies(bundle, torch_modules, package):
    """From the cross K/V inputs to the matmuls with the rows' queries, only value-moving ops (cast to fp16,
    the layer slice, the head reshape): nothing that could tile or broadcast them to the B rows; no tile op in
    the program at all."""
    out, _ = bundle
    spec = _spec(out / f"{package}.mlpackage")
    path = _cross_kv_path(spec)
    n_layer = torch_modules["dims"].n_text_layer
    assert path["matmul"] == 2 * n_layer  # each layer: K with the queries, V with the weights
    assert set(path) - {"matmul"} <= DATA_MOVES, path
    assert not [op for op in _operations(spec) if op.type == "tile"]


def test_beam_decoder_holds_no_rows_of_cross_kv(bundle, torch_modules):
    """In the 5-row program (fixed shapes, so the rows are visible): a tensor with the rows and the 1500
    frames holds fewer values a frame than one head's K or V (64): the attention scores of the heads and the
    alignment heads' weights; the K/V appear only at batch 1."""
    out, _ = bundle
    dims = torch_modules["dims"]
    rows, frames, head_width = export_coreml.BEAM_BATCH, dims.n_audio_ctx, dims.n_text_state // dims.n_text_head
    spec = _spec(out / "TextDecoderStatefulBeam.mlpackage")
    shapes = [_dims(o) for op in _operations(spec) for o in op.outputs]
    with_frames = [d for d in shapes if frames in d and "?" not in d]
    per_row = [d for d in with_frames if d[0] == rows]
    assert per_row and [1, dims.n_text_head, head_width, frames] in with_frames  # not vacuous
    for d in per_row:
        assert np.prod(d) // (rows * frames) < head_width, d


def test_compute_precision_is_fp32_for_mel_and_fp16_elsewhere(bundle):
    out, _ = bundle
    # the mel's 1e-10 floor underflows in fp16
    assert "FLOAT16" not in _tensor_dtypes(_spec(out / "MelSpectrogram.mlpackage"))
    for name in ("AudioEncoder", "TextDecoder", "TextDecoderStateful", "TextDecoderStatefulBeam"):
        spec = _spec(out / f"{name}.mlpackage")
        convs = [op for op in _operations(spec) if op.type == "conv"]
        assert convs and all(
            op.outputs[0].type.tensorType.dataType == ct.proto.MIL_pb2.DataType.Value("FLOAT16")
            for op in convs
        ), name


def test_tied_embedding_is_stored_once(bundle, torch_modules):
    """The token embedding feeds the gather and the logits projection: one copy in the weights, not two."""
    out, _ = bundle
    dims = torch_modules["dims"]
    embedding_bytes = dims.n_vocab * dims.n_text_state * 2  # fp16
    weights = out / "TextDecoder.mlpackage" / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    decoder = torch_modules["decoder"]
    other_params = sum(p.numel() for n, p in decoder.named_parameters() if n != "token_embedding.weight")
    assert weights.stat().st_size < embedding_bytes + 2 * other_params + (1 << 20)


def test_no_palettized_weights_unless_requested(bundle):
    out, components = bundle
    assert not [p for p in out.iterdir() if "palettized" in p.name]
    assert not any("palettized" in kind for kinds in components.values() for kind in kinds)
    for name in ("AudioEncoder", "TextDecoder", "TextDecoderStateful", "TextDecoderStatefulBeam"):
        assert not [
            op for op in _operations(_spec(out / f"{name}.mlpackage")) if op.type.startswith("constexpr_")
        ]


def test_palettized_variant_has_lookup_tables_for_every_weight_matrix(bundle, palettized, torch_modules):
    out, components = palettized
    dims = torch_modules["dims"]
    assert components == {
        "AudioEncoder": {
            "coreml": "AudioEncoder.mlpackage",
            "coreml_palettized": "AudioEncoder.palettized.mlpackage",
        }
    }
    plain = _spec(out / "AudioEncoder.mlpackage")
    small = _spec(out / "AudioEncoder.palettized.mlpackage")
    luts = [op for op in _operations(small) if op.type == "constexpr_lut_to_dense"]
    n_matrices = _large_consts(plain)
    # per block q, k, v, out, fc1, fc2; the conv stem; cross k, v per decoder layer
    assert n_matrices >= dims.n_audio_layer * 6 + 2 + 2 * dims.n_text_layer
    assert len(luts) == n_matrices and _large_consts(small) == 0
    for op in luts:
        assert [d.constant.size for d in op.attributes["lut"].type.tensorType.dimensions] == [2**PALETTE_BITS]
    # same interface as the fp16 package
    assert _features(small.description.input) == _features(plain.description.input)
    assert _features(small.description.output) == _features(plain.description.output)
    size = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())  # noqa: E731
    assert size(out / "AudioEncoder.palettized.mlpackage") < 0.35 * size(out / "AudioEncoder.mlpackage")


def test_palettize_rejects_unsupported_bit_widths(tmp_path, torch_modules):
    from whisperane.errors import ConversionError

    with pytest.raises(ConversionError, match="4, 6 or 8"):
        _export(tmp_path, torch_modules, palettize=3)
    assert not list(tmp_path.iterdir())


# --- the stateful wrapper in torch (every platform) -------------------------------------------------------


def _step_inputs(dims, position: int, token: int, rows: int = 1) -> dict:
    """One step of ``rows`` rows at ``position``: row r feeds token + r (the rows must stay apart)."""
    mask = torch.zeros(rows, S)
    mask[:, position] = 1.0
    padding = torch.full((rows, S), MASK_VALUE)
    padding[:, : position + 1] = 0.0
    return {
        "input_ids": torch.arange(token, token + rows, dtype=torch.int32),
        "cache_length": torch.full((rows,), position, dtype=torch.int32),
        "kv_cache_update_mask": mask,
        "decoder_key_padding_mask": padding,
    }


@pytest.mark.parametrize("rows", [1, 5])
def test_stateful_wrapper_matches_stateless_decoder_with_host_cache_writes(torch_modules, rows):
    dims, decoder = torch_modules["dims"], torch_modules["decoder"]
    g = torch.Generator().manual_seed(0)
    dl = dims.n_text_state * dims.n_text_layer
    enc = {  # batch 1: shared by the rows
        "encoder_attn_key_cache": torch.randn(1, dl, 1, dims.n_audio_ctx, generator=g),
        "encoder_attn_value_cache": torch.randn(1, dl, 1, dims.n_audio_ctx, generator=g),
    }
    eager = export_coreml.TextDecoderStateful(decoder, S, rows).eval()
    example = {n: t for n, t in decoder_example(dims, S, rows).items() if n not in export_coreml.CACHE_NAMES}
    traced = torch.jit.trace(
        export_coreml.TextDecoderStateful(decoder, S, rows).eval(), tuple(example.values()), check_trace=False
    )
    traced.key_cache.zero_()
    traced.value_cache.zero_()
    key_cache, value_cache = torch.zeros(rows, dl, 1, S), torch.zeros(rows, dl, 1, S)
    for position, token in enumerate([50257, 50362, 400]):  # sot, notimestamps, a text token
        step = {**_step_inputs(dims, position, token, rows), **enc}
        logits, k_upd, v_upd, weights = decoder(
            step["input_ids"], step["cache_length"], key_cache, value_cache, step["kv_cache_update_mask"],
            step["decoder_key_padding_mask"], enc["encoder_attn_key_cache"], enc["encoder_attn_value_cache"],
        )
        key_cache[..., position] = k_upd[..., 0]
        value_cache[..., position] = v_upd[..., 0]
        for module in (eager, traced):
            s_logits, s_weights = module(*(step[n] for n in export_coreml.STATEFUL_INPUTS))
            torch.testing.assert_close(s_logits, logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(s_weights, weights, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(module.key_cache, key_cache, rtol=0, atol=1e-6)
            torch.testing.assert_close(module.value_cache, value_cache, rtol=0, atol=1e-6)
    assert key_cache[..., 2].abs().sum() > 0 and key_cache[..., 3:].abs().sum() == 0
    assert rows == 1 or (key_cache[0, ..., 2] - key_cache[1, ..., 2]).abs().max() > 0.1  # rows kept apart


# --- the runtime's stateful adapter: a beam walk (every platform, over the torch wrapper) -------------------

SOT, NO_TIMESTAMPS = 50257, 50362  # tiny.en's forced prefix (the random model has its vocabulary)
BEAM_TOKENS = ([400, 293, 286, 257, 11], [290, 340, 318, 13, 284], [257, 1110, 383, 314, 632])
# the rows after each step: duplicated (two beams from one), reversed, mixed
REORDERS = ([0, 0, 1, 2, 1], [4, 3, 2, 1, 0], [1, 1, 0, 3, 2])


class _FakeMLState:
    """An MLState on the host: named arrays, read and written whole, as coremltools' read/write_state do."""

    def __init__(self, shape: tuple[int, ...]):
        self.arrays = {n: np.zeros(shape, dtype=np.float32) for n in export_coreml.CACHE_NAMES}

    def read_state(self, name: str) -> np.ndarray:
        return self.arrays[name].copy()

    def write_state(self, name: str, value: np.ndarray) -> None:
        assert value.shape == self.arrays[name].shape, (name, value.shape)
        self.arrays[name] = np.asarray(value, dtype=np.float32).copy()


class _TorchStatefulPackage:
    """A stateful Core ML package on Linux: the torch module the exporter converts (TextDecoderStateful at
    ``rows`` rows), its cache buffers loaded from and saved to the call's MLState around each prediction."""

    def __init__(self, decoder, rows: int):
        self.module = export_coreml.TextDecoderStateful(decoder, S, rows).eval()
        self.inputs = {"input_ids": (rows,)}

    def make_state(self) -> _FakeMLState:
        return _FakeMLState(tuple(self.module.key_cache.shape))

    def run(self, feeds: dict, outputs=None, state=None) -> dict:
        for name in export_coreml.CACHE_NAMES:
            getattr(self.module, name).copy_(torch.from_numpy(state.arrays[name]))
        args = (torch.from_numpy(np.asarray(feeds[n])) for n in export_coreml.STATEFUL_INPUTS)
        logits, weights = self.module(*args)
        for name in export_coreml.CACHE_NAMES:
            state.arrays[name] = getattr(self.module, name).numpy().copy()
        return {"logits": logits.numpy(), "alignment_heads_weights": weights.numpy()}


def _layout(dims) -> CacheLayout:
    return CacheLayout(dims.n_text_layer, dims.n_text_state, S, per_layer=False)


def _beam_walk(decoder, cross: CrossAttention, rows: int, sot_kv: tuple) -> list[tuple]:
    """sot's K/V written from the host (the prefill table's way in), <|notimestamps|> run on one row, its
    cache copied to ``rows`` rows, then a step per REORDERS entry after gathering the rows (``state.select``).
    Returns (logits [rows, V], alignment [rows, A, F], each row's tokens after sot) for every step."""
    single = decoder.pool.acquire(1)
    single.write(*sot_kv)
    first, first_align = decoder.forward(single, np.array([[NO_TIMESTAMPS]]), cross)
    state = decoder.pool.acquire(rows)
    state.copy_prefix_from(single)
    decoder.pool.release(single)
    histories = [[NO_TIMESTAMPS]] * rows
    steps = [(np.repeat(first[:, -1], rows, axis=0), np.repeat(first_align[:, :, -1], rows, axis=0), histories)]
    for tokens, order in zip(BEAM_TOKENS, REORDERS, strict=True):
        order = [r % rows for r in order[:rows]]
        state.select(np.array(order))
        histories = [[*histories[r], token] for r, token in zip(order, tokens, strict=False)]
        logits, align = decoder.step(state, np.array(tokens[:rows]), cross)
        steps.append((logits, align, histories))
    assert (state.lengths == 2 + len(REORDERS)).all()
    decoder.pool.release(state)
    return steps


def _decoded_alone(reference, cross: CrossAttention, sot_kv: tuple, histories: list) -> tuple:
    """Each row's logits and alignment from its own tokens, decoded alone from sot (no rows, no reordering)."""
    logits, align = [], []
    for tokens in histories:
        state = reference.pool.acquire(1)
        state.write(*sot_kv)
        row_logits, row_align = reference.forward(state, np.array([tokens]), cross)
        reference.pool.release(state)
        logits.append(row_logits[0, -1])
        align.append(row_align[0, :, -1])
    return np.stack(logits), np.stack(align)


@pytest.fixture(scope="module")
def onnx_reference(tmp_path_factory, torch_modules, window) -> tuple:
    """The ONNX float32 TextDecoder (exported as the pipeline exports it: the BTC layout, from the same weights)
    through the one-hot adapter, the window's cross K/V, and sot's K/V as that decoder computes them."""
    dims = torch_modules["dims"]
    btc = modules.build_decoder(torch_modules["checkpoint"], modules.TextDecoder, sdpa="einsum", layout="btc")
    path = export_decoder(btc, dims, S, tmp_path_factory.mktemp("onnx_reference") / "TextDecoder.onnx")
    component = OnnxComponent(path, threads=1)
    decoder = OneHotDecoder(_layout(dims), component)
    cross = CrossAttention({"encoder_attn_key_cache": window["enc_k"].numpy(),
                            "encoder_attn_value_cache": window["enc_v"].numpy()}, 1)
    state = decoder.pool.acquire(1)
    decoder.step(state, np.array([SOT]), cross)
    sot_kv = (state.keys[0][..., :1].copy(), state.values[0][..., :1].copy())
    decoder.pool.release(state)
    return decoder, cross, sot_kv


@pytest.mark.parametrize("rows", [5, 3])
def test_stateful_adapter_beam_walk_matches_onnx(torch_modules, onnx_reference, rows):
    """StatefulDecoder with MLState rows (the 5-row package; 3 beams leave two rows idle): the prefix written
    and copied in through the state, beams duplicated and reordered by read/gather/write; every step's rows
    equal to the ONNX float32 decoder running each row's tokens alone."""
    reference, cross, sot_kv = onnx_reference
    dims, torch_decoder = torch_modules["dims"], torch_modules["decoder"]
    single = _TorchStatefulPackage(torch_decoder, 1)
    beam = _TorchStatefulPackage(torch_decoder, export_coreml.BEAM_BATCH)
    stateful = StatefulDecoder(_layout(dims), single, batched=beam)
    for step, (logits, align, histories) in enumerate(_beam_walk(stateful, cross, rows, sot_kv)):
        want, want_align = _decoded_alone(reference, cross, sot_kv, histories)
        assert logits.shape == want.shape == (rows, dims.n_vocab)
        np.testing.assert_allclose(logits, want, rtol=0, atol=2e-3, err_msg=f"step {step}")
        np.testing.assert_allclose(align, want_align, rtol=0, atol=1e-4, err_msg=f"step {step}")
    assert np.abs(want[0] - want[1]).max() > 1.0  # the last step's rows differ: a wrong gather would show


def test_stateful_adapter_refuses_more_rows_than_its_packages(torch_modules):
    from whisperane.errors import ModelError

    dims, torch_decoder = torch_modules["dims"], torch_modules["decoder"]
    single_only = StatefulDecoder(_layout(dims), _TorchStatefulPackage(torch_decoder, 1))
    with pytest.raises(ModelError, match="at most 1 rows"):
        single_only.pool.acquire(5)


# --- predictions (macOS) ----------------------------------------------------------------------------------


def _load(path: Path):
    return ct.models.MLModel(str(path), compute_units=ct.ComputeUnit.CPU_ONLY)


def _np(d: dict) -> dict:
    return {k: v.numpy() for k, v in d.items()}


@pytest.fixture(scope="module")
def window(torch_modules) -> dict:
    """One real 30 s window (JFK) through the torch modules: the reference inputs of every component."""
    return torch_modules["window"]


@macos_only
def test_coreml_mel_matches_torch(bundle, window):
    got = _load(bundle[0] / "MelSpectrogram.mlpackage").predict({"audio": window["audio"].numpy()})
    assert psnr(window["mel"].numpy(), got["melspectrogram_features"]) >= 35


@macos_only
def test_coreml_encoder_matches_torch(bundle, window):
    got = _load(bundle[0] / "AudioEncoder.mlpackage").predict(
        {"melspectrogram_features": window["mel"].numpy()}
    )
    for name, ref in (
        ("encoder_output_embeds", "embeds"),
        ("encoder_attn_key_cache", "enc_k"),
        ("encoder_attn_value_cache", "enc_v"),
    ):
        assert psnr(window[ref].numpy(), got[name]) >= 35, name


@macos_only
def test_coreml_prefill_matches_torch(bundle, torch_modules):
    inputs = {
        "task": torch.tensor([0], dtype=torch.int32),
        "language": torch.tensor([50259], dtype=torch.int32),
    }
    k, v = torch_modules["prefill"](**inputs)
    got = _load(bundle[0] / "TextDecoderContextPrefill.mlpackage").predict(_np(inputs))
    assert psnr(k.numpy(), got["key_cache_prefill"]) >= 35
    assert psnr(v.numpy(), got["value_cache_prefill"]) >= 35


@macos_only
def test_coreml_decoders_match_torch_over_several_steps(bundle, torch_modules, window):
    dims, decoder = torch_modules["dims"], torch_modules["decoder"]
    dl = dims.n_text_state * dims.n_text_layer
    stateless = _load(bundle[0] / "TextDecoder.mlpackage")
    stateful = _load(bundle[0] / "TextDecoderStateful.mlpackage")
    state = stateful.make_state()
    enc = {"encoder_attn_key_cache": window["enc_k"], "encoder_attn_value_cache": window["enc_v"]}
    key_cache, value_cache = torch.zeros(1, dl, 1, S), torch.zeros(1, dl, 1, S)
    for position, token in enumerate([50257, 50362, 400]):
        step = {**_step_inputs(dims, position, token), **enc}
        full = {**step, "key_cache": key_cache, "value_cache": value_cache}
        ref = decoder(*(full[n] for n in export_coreml.DECODER_INPUTS))
        got = stateless.predict(_np(full))
        for name, r in zip(export_coreml.DECODER_OUTPUTS, ref, strict=True):
            assert psnr(r.numpy(), got[name]) >= 35, (position, name)
        got_state = stateful.predict(_np(step), state=state)
        for name in export_coreml.STATEFUL_OUTPUTS:
            r = ref[export_coreml.DECODER_OUTPUTS.index(name)]
            assert psnr(r.numpy(), got_state[name]) >= 35, (position, name)
        key_cache[..., position] = ref[1][..., 0]
        value_cache[..., position] = ref[2][..., 0]


@macos_only
@pytest.mark.parametrize("stateful", [False, True], ids=["TextDecoder", "TextDecoderStatefulBeam"])
def test_coreml_beam_walk_matches_onnx_float32(bundle, torch_modules, onnx_reference, stateful):
    """Beam 5 through the Core ML decoders (the stateless one at 5 rows; the stateful pair, reordering through
    MLState), against the ONNX float32 decoder: fp16 agreement (PSNR >= 35 dB) and the same best token."""
    reference, cross, sot_kv = onnx_reference
    dims, out = torch_modules["dims"], bundle[0]
    open_package = lambda name: CoreMLComponent(out / f"{name}.mlpackage", "CPU_ONLY")  # noqa: E731
    if stateful:
        decoder = StatefulDecoder(_layout(dims), open_package("TextDecoderStateful"),
                                  batched=open_package("TextDecoderStatefulBeam"))
    else:
        decoder = OneHotDecoder(_layout(dims), open_package("TextDecoder"))
    for step, (logits, _, histories) in enumerate(_beam_walk(decoder, cross, 5, sot_kv)):
        want, _ = _decoded_alone(reference, cross, sot_kv, histories)
        assert psnr(want, logits) >= 35, step
        assert (want.argmax(-1) == logits.argmax(-1)).all(), step
