"""Core ML export (whisperane/convert/export_coreml.py) on the real tiny.en weights.

Everywhere: the packages are built once per session and their specs are checked against the component
contract (DESIGN.md §2): names, shapes, dtypes and states, ML Program type, deployment targets, compute
precision, palettized weights only on request; and the stateful decoder wrapper is checked in torch (eager
and traced, the graph Core ML receives) against the stateless decoder with host-side cache writes.
On macOS also: each package's predictions against its torch module (PSNR >= 35 dB).
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
from whisperane.convert import export_coreml, modules  # noqa: E402
from whisperane.convert.checkpoint import load_checkpoint  # noqa: E402
from whisperane.convert.export_onnx import decoder_example  # noqa: E402
from whisperane.convert.prefill import compute_prefill_table, random_encoder_outputs  # noqa: E402

pytestmark = pytest.mark.slow

S = 448  # the default cache length, as the pipeline converts it
PALETTE_BITS = 4
JFK = Path(__file__).parent / "data" / "jfk.flac"
macos_only = pytest.mark.skipif(
    sys.platform != "darwin",
    reason="Core ML runtime (predict) exists only on macOS; Linux builds and checks the specs",
)


# --- one build per session --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def torch_modules(ct2_tiny_en_dir):
    torch.set_grad_enabled(False)
    ckpt = load_checkpoint(ct2_tiny_en_dir)
    dims = ckpt.dims
    encoder = modules.build_encoder(ckpt, sdpa="chunked")
    sequence = modules.build_decoder(ckpt, modules.TextDecoderSequence)
    enc_k, enc_v = random_encoder_outputs(encoder, modules.MelSpectrogram(dims.n_mels))
    key_table, value_table = compute_prefill_table(sequence, enc_k, enc_v, 50257, [], [], S)
    return {
        "dims": dims,
        "mel": modules.MelSpectrogram(dims.n_mels).eval(),
        "encoder": encoder,
        "decoder": modules.build_decoder(ckpt, modules.TextDecoder),
        "prefill": modules.TextDecoderContextPrefill(key_table, value_table, 0, 1),
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
def palettized(tmp_path_factory, torch_modules) -> tuple[Path, dict]:
    """The encoder with palettization requested: the cheapest component that exercises the path."""
    out = tmp_path_factory.mktemp("coreml_palettized")
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
    """Constant tensors with at least the palettization threshold of elements."""
    n = 0
    for op in _operations(spec):
        if op.type == "const":
            t = op.attributes["val"].type.tensorType
            size = int(np.prod([d.constant.size for d in t.dimensions])) if t.rank else 1
            n += size >= export_coreml.PALETTIZE_WEIGHT_THRESHOLD
    return n


def _contract(dims) -> dict:
    """The contract's tensors at batch 1 (DESIGN.md §2), written out independently of the exporter."""
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
                "alignment_heads_weights": (f32, [1, 8, f]),  # tiny.en has 8 alignment heads
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
        "TextDecoderContextPrefill",
    ):
        assert (out / f"{name}.mlpackage" / "Manifest.json").is_file()


@pytest.mark.parametrize(
    "component", ["MelSpectrogram", "AudioEncoder", "TextDecoder", "TextDecoderContextPrefill"]
)
def test_stateless_package_matches_the_contract(bundle, torch_modules, component):
    out, _ = bundle
    spec = _spec(out / f"{component}.mlpackage")
    inputs, outputs = _contract(torch_modules["dims"])[component]
    assert spec.WhichOneof("Type") == "mlProgram"
    assert spec.specificationVersion == 7  # Core ML 6: macOS 13 / iOS 16
    assert _features(spec.description.input) == inputs
    assert [f.name for f in spec.description.input] == list(inputs)  # the ONNX argument order
    assert _features(spec.description.output) == outputs
    assert [f.name for f in spec.description.output] == list(outputs)
    assert len(spec.description.state) == 0


def test_stateful_decoder_keeps_the_caches_in_state(bundle, torch_modules):
    out, _ = bundle
    spec = _spec(out / "TextDecoderStateful.mlpackage")
    inputs, outputs = _contract(torch_modules["dims"])["TextDecoder"]
    dl = torch_modules["dims"].n_text_state * torch_modules["dims"].n_text_layer
    assert spec.WhichOneof("Type") == "mlProgram"
    assert spec.specificationVersion == 9  # Core ML 8: macOS 15 / iOS 18, the first with MLState
    assert _features(spec.description.input) == {
        n: t for n, t in inputs.items() if n not in ("key_cache", "value_cache")
    }
    assert _features(spec.description.output) == {
        n: outputs[n] for n in ("logits", "alignment_heads_weights")
    }
    assert _features(spec.description.state) == {
        "key_cache": ("FLOAT16", [1, dl, 1, S]),
        "value_cache": ("FLOAT16", [1, dl, 1, S]),
    }
    ops = Counter(op.type for op in _operations(spec))
    assert ops["read_state"] == 2 and ops["write_state"] == 2  # each cache read once and written back once


def test_compute_precision_is_fp32_for_mel_and_fp16_elsewhere(bundle):
    out, _ = bundle
    # the mel's 1e-10 floor underflows in fp16
    assert "FLOAT16" not in _tensor_dtypes(_spec(out / "MelSpectrogram.mlpackage"))
    for name in ("AudioEncoder", "TextDecoder", "TextDecoderStateful"):
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
    for name in ("AudioEncoder", "TextDecoder", "TextDecoderStateful"):
        assert not [
            op for op in _operations(_spec(out / f"{name}.mlpackage")) if op.type.startswith("constexpr_")
        ]


def test_palettized_variant_has_lookup_tables_for_every_weight_matrix(bundle, palettized):
    out, components = palettized
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
    assert n_matrices >= 4 * 6 + 2 + 2 * 4
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


def _step_inputs(dims, position: int, token: int) -> dict:
    mask = torch.zeros(1, S)
    mask[0, position] = 1.0
    padding = torch.full((1, S), modules.MASK_VALUE)
    padding[0, : position + 1] = 0.0
    return {
        "input_ids": torch.tensor([token], dtype=torch.int32),
        "cache_length": torch.tensor([position], dtype=torch.int32),
        "kv_cache_update_mask": mask,
        "decoder_key_padding_mask": padding,
    }


def test_stateful_wrapper_matches_stateless_decoder_with_host_cache_writes(torch_modules):
    dims, decoder = torch_modules["dims"], torch_modules["decoder"]
    g = torch.Generator().manual_seed(0)
    dl = dims.n_text_state * dims.n_text_layer
    enc = {
        "encoder_attn_key_cache": torch.randn(1, dl, 1, dims.n_audio_ctx, generator=g),
        "encoder_attn_value_cache": torch.randn(1, dl, 1, dims.n_audio_ctx, generator=g),
    }
    eager = export_coreml.TextDecoderStateful(decoder, S).eval()
    example = {n: t for n, t in decoder_example(dims, S).items() if n not in export_coreml.CACHE_NAMES}
    traced = torch.jit.trace(
        export_coreml.TextDecoderStateful(decoder, S).eval(), tuple(example.values()), check_trace=False
    )
    traced.key_cache.zero_()
    traced.value_cache.zero_()
    key_cache, value_cache = torch.zeros(1, dl, 1, S), torch.zeros(1, dl, 1, S)
    for position, token in enumerate([50257, 50362, 400]):  # sot, notimestamps, a text token
        step = {**_step_inputs(dims, position, token), **enc}
        logits, k_upd, v_upd, weights = decoder(
            step["input_ids"], step["cache_length"], key_cache, value_cache, step["kv_cache_update_mask"],
            step["decoder_key_padding_mask"], enc["encoder_attn_key_cache"], enc["encoder_attn_value_cache"],
        )  # fmt: skip
        key_cache[..., position] = k_upd[..., 0]
        value_cache[..., position] = v_upd[..., 0]
        for module in (eager, traced):
            s_logits, s_weights = module(*(step[n] for n in export_coreml.STATEFUL_INPUTS))
            torch.testing.assert_close(s_logits, logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(s_weights, weights, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(module.key_cache, key_cache, rtol=0, atol=1e-6)
            torch.testing.assert_close(module.value_cache, value_cache, rtol=0, atol=1e-6)
    assert key_cache[..., 2].abs().sum() > 0 and key_cache[..., 3:].abs().sum() == 0


# --- predictions (macOS) ----------------------------------------------------------------------------------


def _load(path: Path):
    return ct.models.MLModel(str(path), compute_units=ct.ComputeUnit.CPU_ONLY)


def _np(d: dict) -> dict:
    return {k: v.numpy() for k, v in d.items()}


@pytest.fixture(scope="module")
def window(torch_modules) -> dict:
    """One real 30 s window (JFK) through the torch modules: the reference inputs of every component."""
    audio = torch.from_numpy(pad_or_trim(load_audio(str(JFK))).astype(np.float32))
    mel = torch_modules["mel"](audio)
    embeds, enc_k, enc_v = torch_modules["encoder"](mel)
    return {"audio": audio, "mel": mel, "embeds": embeds, "enc_k": enc_k, "enc_v": enc_v}


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
