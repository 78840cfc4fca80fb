"""Checkpoint loaders: CTranslate2 / faster-whisper, Hugging Face transformers and OpenAI ``.pt``.

Every loader returns a :class:`Checkpoint` whose ``state_dict`` uses openai-whisper's parameter names
(``encoder.blocks.0.attn.query.weight`` ...) as float32 numpy arrays, and whose dimensions are read from the
weights themselves, never from a table of model names.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..dims import ModelDimensions
from ..errors import ModelError
from .ctranslate2_format import read_ctranslate2_model
from .sources import detect_format


@dataclass
class Checkpoint:
    dims: ModelDimensions
    state_dict: dict[str, np.ndarray]
    alignment_heads: list[tuple[int, int]]  # (layer, head), decoder cross-attention
    format: str  # "ctranslate2" | "huggingface" | "openai"
    path: Path
    extra: dict = field(default_factory=dict)


def load_checkpoint(path: str | Path, fmt: str | None = None) -> Checkpoint:
    path = Path(path)
    fmt = fmt or detect_format(path)
    loader = {"ctranslate2": _load_ctranslate2, "huggingface": _load_huggingface, "openai": _load_openai}[fmt]
    ckpt = loader(path)
    _check_complete(ckpt)
    return ckpt


# --- dimensions ---------------------------------------------------------------------------------------


def dims_from_state_dict(sd: dict[str, np.ndarray], n_audio_head: int, n_text_head: int) -> ModelDimensions:
    def count(prefix: str) -> int:
        idx = {int(m.group(1)) for k in sd if (m := re.match(rf"{prefix}\.blocks\.(\d+)\.", k))}
        return max(idx) + 1 if idx else 0

    try:
        conv1 = sd["encoder.conv1.weight"]
        emb = sd["decoder.token_embedding.weight"]
        return ModelDimensions(
            n_mels=int(conv1.shape[1]),
            n_audio_ctx=int(sd["encoder.positional_embedding"].shape[0]),
            n_audio_state=int(conv1.shape[0]),
            n_audio_head=int(n_audio_head),
            n_audio_layer=count("encoder"),
            n_vocab=int(emb.shape[0]),
            n_text_ctx=int(sd["decoder.positional_embedding"].shape[0]),
            n_text_state=int(emb.shape[1]),
            n_text_head=int(n_text_head),
            n_text_layer=count("decoder"),
        )
    except KeyError as e:
        raise ModelError(f"checkpoint is not a Whisper model: missing {e.args[0]}") from None


def default_alignment_heads(dims: ModelDimensions) -> list[tuple[int, int]]:
    """openai-whisper's fallback when a checkpoint names none: all heads of the second half of the decoder."""
    half = dims.n_text_layer // 2
    return [(layer, head) for layer in range(half, dims.n_text_layer) for head in range(dims.n_text_head)]


def _check_complete(ckpt: Checkpoint) -> None:
    d = ckpt.dims
    expected = ["encoder.ln_post.weight", "decoder.ln.weight", "encoder.conv2.weight"]
    for i in range(d.n_audio_layer):
        expected += [f"encoder.blocks.{i}.attn.{p}.weight" for p in ("query", "key", "value", "out")]
        expected += [f"encoder.blocks.{i}.mlp.0.weight", f"encoder.blocks.{i}.mlp.2.weight"]
    for i in range(d.n_text_layer):
        for a in ("attn", "cross_attn"):
            expected += [f"decoder.blocks.{i}.{a}.{p}.weight" for p in ("query", "key", "value", "out")]
        expected += [f"decoder.blocks.{i}.mlp.0.weight", f"decoder.blocks.{i}.mlp.2.weight"]
    missing = [k for k in expected if k not in ckpt.state_dict]
    if missing or d.n_audio_layer == 0 or d.n_text_layer == 0:
        raise ModelError(f"{ckpt.path}: checkpoint is not a complete Whisper model (missing {missing[:3]}...)")
    if d.n_audio_state % d.n_audio_head or d.n_text_state % d.n_text_head:
        raise ModelError(f"{ckpt.path}: head count does not divide the model width")


# --- CTranslate2 --------------------------------------------------------------------------------------

_CT2_LINEAR = {"linear_0": "0", "linear_1": "2"}


def _load_ctranslate2(path: Path) -> Checkpoint:
    spec, v = read_ctranslate2_model(path / "model.bin")
    if "Whisper" not in spec:
        raise ModelError(f"{path}: CTranslate2 model is a {spec!r}, not a Whisper model")
    f32 = {k: np.asarray(a, dtype=np.float32) for k, a in v.items() if a.ndim > 0}
    sd: dict[str, np.ndarray] = {}

    def attn(dst: str, src: str, fused_qkv: bool) -> None:
        if fused_qkv:
            w, b = f32[f"{src}/linear_0/weight"], f32[f"{src}/linear_0/bias"]
            d = w.shape[1]
            sd[f"{dst}.query.weight"], sd[f"{dst}.key.weight"], sd[f"{dst}.value.weight"] = w[:d], w[d : 2 * d], w[2 * d :]
            sd[f"{dst}.query.bias"], sd[f"{dst}.value.bias"] = b[:d], b[2 * d :]
            sd[f"{dst}.out.weight"], sd[f"{dst}.out.bias"] = f32[f"{src}/linear_1/weight"], f32[f"{src}/linear_1/bias"]
        else:  # cross attention: linear_0 = q, linear_1 = fused k,v, linear_2 = out
            sd[f"{dst}.query.weight"], sd[f"{dst}.query.bias"] = f32[f"{src}/linear_0/weight"], f32[f"{src}/linear_0/bias"]
            w, b = f32[f"{src}/linear_1/weight"], f32[f"{src}/linear_1/bias"]
            d = w.shape[1]
            sd[f"{dst}.key.weight"], sd[f"{dst}.value.weight"] = w[:d], w[d:]
            sd[f"{dst}.value.bias"] = b[d:]
            sd[f"{dst}.out.weight"], sd[f"{dst}.out.bias"] = f32[f"{src}/linear_2/weight"], f32[f"{src}/linear_2/bias"]
        ln = f"{src}/layer_norm"
        sd[f"{dst}_ln.weight"], sd[f"{dst}_ln.bias"] = f32[f"{ln}/gamma"], f32[f"{ln}/beta"]

    def mlp(dst: str, src: str) -> None:
        for ct2, oa in _CT2_LINEAR.items():
            sd[f"{dst}.mlp.{oa}.weight"] = f32[f"{src}/ffn/{ct2}/weight"]
            sd[f"{dst}.mlp.{oa}.bias"] = f32[f"{src}/ffn/{ct2}/bias"]
        sd[f"{dst}.mlp_ln.weight"], sd[f"{dst}.mlp_ln.bias"] = f32[f"{src}/ffn/layer_norm/gamma"], f32[f"{src}/ffn/layer_norm/beta"]

    try:
        for conv in ("conv1", "conv2"):
            sd[f"encoder.{conv}.weight"], sd[f"encoder.{conv}.bias"] = f32[f"encoder/{conv}/weight"], f32[f"encoder/{conv}/bias"]
        sd["encoder.positional_embedding"] = f32["encoder/position_encodings/encodings"]
        sd["encoder.ln_post.weight"], sd["encoder.ln_post.bias"] = f32["encoder/layer_norm/gamma"], f32["encoder/layer_norm/beta"]
        sd["decoder.token_embedding.weight"] = f32["decoder/embeddings/weight"]
        sd["decoder.positional_embedding"] = f32["decoder/position_encodings/encodings"]
        sd["decoder.ln.weight"], sd["decoder.ln.bias"] = f32["decoder/layer_norm/gamma"], f32["decoder/layer_norm/beta"]
        i = 0
        while f"encoder/layer_{i}/self_attention/linear_0/weight" in f32:
            attn(f"encoder.blocks.{i}.attn", f"encoder/layer_{i}/self_attention", True)
            mlp(f"encoder.blocks.{i}", f"encoder/layer_{i}")
            i += 1
        i = 0
        while f"decoder/layer_{i}/self_attention/linear_0/weight" in f32:
            attn(f"decoder.blocks.{i}.attn", f"decoder/layer_{i}/self_attention", True)
            attn(f"decoder.blocks.{i}.cross_attn", f"decoder/layer_{i}/attention", False)
            mlp(f"decoder.blocks.{i}", f"decoder/layer_{i}")
            i += 1
    except KeyError as e:
        raise ModelError(f"{path}: CTranslate2 checkpoint is not a complete Whisper model: missing {e.args[0]}") from None
    dims = dims_from_state_dict(sd, int(v["encoder/num_heads"]), int(v["decoder/num_heads"]))
    cfg = json.loads((path / "config.json").read_text())
    heads = [tuple(int(x) for x in h) for h in cfg.get("alignment_heads") or []] or default_alignment_heads(dims)
    return Checkpoint(dims, sd, heads, "ctranslate2", path, extra={"ct2_config": cfg})


# --- Hugging Face --------------------------------------------------------------------------------------

_HF_ATTN = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "out_proj": "out"}


def openai_to_hf_name(name: str) -> str:
    """Map an openai-whisper parameter name to the transformers WhisperForConditionalGeneration name."""
    n = name
    n = n.replace("encoder.positional_embedding", "encoder.embed_positions.weight")
    n = n.replace("decoder.positional_embedding", "decoder.embed_positions.weight")
    n = n.replace("decoder.token_embedding", "decoder.embed_tokens")
    n = n.replace("encoder.ln_post", "encoder.layer_norm").replace("decoder.ln.", "decoder.layer_norm.")
    n = n.replace(".blocks.", ".layers.")
    n = re.sub(r"\.cross_attn_ln\.", ".encoder_attn_layer_norm.", n)
    n = re.sub(r"\.attn_ln\.", ".self_attn_layer_norm.", n)
    n = re.sub(r"\.mlp_ln\.", ".final_layer_norm.", n)
    n = n.replace(".mlp.0.", ".fc1.").replace(".mlp.2.", ".fc2.")
    for hf, oa in _HF_ATTN.items():
        n = n.replace(f".cross_attn.{oa}.", f".encoder_attn.{hf}.").replace(f".attn.{oa}.", f".self_attn.{hf}.")
    return "model." + n


def _load_huggingface(path: Path) -> Checkpoint:
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("model_type") != "whisper":
        raise ModelError(f"{path}: Hugging Face model type is {cfg.get('model_type')!r}, not 'whisper'")
    if (path / "model.safetensors").is_file():
        from safetensors.numpy import load_file

        hf = load_file(str(path / "model.safetensors"))
    else:
        import torch

        hf = {k: t.float().numpy() for k, t in torch.load(path / "pytorch_model.bin", map_location="cpu").items()}
    hf = {k if k.startswith("model.") or k == "proj_out.weight" else "model." + k: v for k, v in hf.items()}
    # Invert the openai→HF mapping on the names the HF file actually has.
    sd: dict[str, np.ndarray] = {}
    candidates = _openai_names(cfg["encoder_layers"], cfg["decoder_layers"])
    for oa in candidates:
        hfn = openai_to_hf_name(oa)
        if hfn in hf:
            sd[oa] = np.asarray(hf[hfn], dtype=np.float32)
    dims = dims_from_state_dict(sd, cfg["encoder_attention_heads"], cfg["decoder_attention_heads"])
    heads: list[tuple[int, int]] = []
    gen = path / "generation_config.json"
    if gen.is_file():
        heads = [tuple(h) for h in json.loads(gen.read_text()).get("alignment_heads") or []]
    return Checkpoint(dims, sd, heads or default_alignment_heads(dims), "huggingface", path, extra={"hf_config": cfg})


def _openai_names(n_enc: int, n_dec: int) -> list[str]:
    out = [
        "encoder.conv1.weight", "encoder.conv1.bias", "encoder.conv2.weight", "encoder.conv2.bias",
        "encoder.positional_embedding", "encoder.ln_post.weight", "encoder.ln_post.bias",
        "decoder.token_embedding.weight", "decoder.positional_embedding", "decoder.ln.weight", "decoder.ln.bias",
    ]
    def block(prefix: str, attns: tuple[str, ...]) -> list[str]:
        names = []
        for a in attns:
            for p in ("query", "key", "value", "out"):
                names += [f"{prefix}.{a}.{p}.weight"] + ([] if p == "key" else [f"{prefix}.{a}.{p}.bias"])
            names += [f"{prefix}.{a}_ln.weight", f"{prefix}.{a}_ln.bias"]
        for p in ("mlp.0", "mlp.2", "mlp_ln"):
            names += [f"{prefix}.{p}.weight", f"{prefix}.{p}.bias"]
        return names

    for i in range(n_enc):
        out += block(f"encoder.blocks.{i}", ("attn",))
    for i in range(n_dec):
        out += block(f"decoder.blocks.{i}", ("attn", "cross_attn"))
    return out


def to_hf_state_dict(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The checkpoint in transformers' naming (test and export helper)."""
    out = {openai_to_hf_name(k): v for k, v in ckpt.state_dict.items()}
    out["proj_out.weight"] = ckpt.state_dict["decoder.token_embedding.weight"]
    return out


# --- OpenAI .pt -----------------------------------------------------------------------------------------


def _load_openai(path: Path) -> Checkpoint:
    import torch

    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise ModelError(f"{path}: cannot read OpenAI checkpoint ({type(e).__name__})") from None
    if not isinstance(blob, dict) or "model_state_dict" not in blob or "dims" not in blob:
        raise ModelError(f"{path}: not an OpenAI Whisper checkpoint (no dims/model_state_dict)")
    sd = {k: v.float().numpy() for k, v in blob["model_state_dict"].items()}
    dims = ModelDimensions.from_dict(blob["dims"])
    heads: list[tuple[int, int]] = []
    if blob.get("alignment_heads") is not None:
        raw = blob["alignment_heads"]
        if isinstance(raw, (bytes, str)):
            mask = np.frombuffer(gzip.decompress(base64.b85decode(raw)), dtype=bool)
            mask = mask.reshape(dims.n_text_layer, dims.n_text_head)
            heads = [(int(a), int(b)) for a, b in zip(*np.nonzero(mask), strict=True)]
    return Checkpoint(dims, sd, heads or default_alignment_heads(dims), "openai", path)
