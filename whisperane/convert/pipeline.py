"""``whisperane convert``: checkpoint -> model bundle (docs/DESIGN.md §3).

The bundle is built in a temporary sibling directory and renamed into place only when every file and the
config (with a sha256 per file) are written, so an interrupted conversion never leaves a bundle that looks
complete. Converting an unchanged source with the same options again is a no-op.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from ..contract import CONFIG_NAME, CONTRACT_VERSION, CONVERTER_REVISION
from ..errors import ConversionError, ModelError
from ..runtime.bundle import bundle_name, default_models_dir, verify_bundle
from ..runtime.executors import heap_keeps_large_blocks
from ..util import file_sha256
from ..version import __version__
from . import export_onnx, modules, quantize
from .checkpoint import load_checkpoint
from .prefill import compute_prefill_table, random_encoder_outputs
from .sources import resolve_source
from .tokenizer_build import build_tokenizer_json, token_config

FORMATS = ("onnx", "coreml")
# Components that also get an ONNX Runtime variant with int8 weights: the decoder, whose per-token cost is
# reading weights and caches, as weight-only MatMulNBits with each cache one input per layer (no per-step copy of
# the concatenated caches); only TextDecoderSequence, which the runtime then uses for single steps too (one
# session); the encoder, compute-bound on 1500 frames, with dynamically quantized MatMuls.
INT8_COMPONENTS = ("AudioEncoder", "TextDecoderSequence")
TOKEN_EMBEDDING_FILE = "TokenEmbedding.int8.npy"  # the int8 decoder's token lookup table, read by the host
INT8_PRECISION = ("TextDecoderSequence (also the one-token decoder): int8 weights (MatMulNBits, blocks of 32), each "
                  "cache one input per layer, token lookup on the host (TokenEmbedding.int8.npy, the same int8 rows); "
                  "AudioEncoder: dynamic int8 MatMuls (7-bit weights per channel, activations per tensor; the MLPs' second "
                  "projections' activations per row), "
                  "cross K/V one output per layer; "
                  "the rest float32")


def convert(
    source: str,
    out_dir: str | os.PathLike | None = None,
    formats: tuple[str, ...] = ("onnx",),
    cache_length: int | None = None,
    palettize: int | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Convert ``source`` (a model name or a checkpoint path) into a bundle and return its directory."""
    say = progress or (lambda _msg: None)
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ConversionError(f"unknown format {bad[0]!r}; choose from {', '.join(FORMATS)}")
    if palettize is not None and palettize not in (4, 6, 8):
        raise ConversionError(f"--palettize takes 4, 6 or 8 bits, not {palettize}")
    if palettize is not None and "coreml" not in formats:
        raise ConversionError("--palettize applies to Core ML packages: add coreml to --formats")
    resolved = resolve_source(source, progress=progress is not None)
    out = Path(out_dir) if out_dir else default_models_dir() / bundle_name(source)
    lock_path = out.parent / f".{out.name}.lock"
    if out.parent.exists() and not out.parent.is_dir():
        raise ConversionError(f"{out}: cannot write the bundle there ({out.parent} is not a directory)")
    try:  # FileLock would wait forever on a lock file it cannot create: fail here instead
        out.parent.mkdir(parents=True, exist_ok=True)
        lock_path.touch(exist_ok=True)
    except OSError as err:
        raise ConversionError(f"{out}: cannot write the bundle there ({err.strerror or err})") from None

    ckpt = load_checkpoint(resolved.path, resolved.format)
    dims = ckpt.dims
    s = cache_length or dims.n_text_ctx
    if not 8 <= s <= dims.n_text_ctx:
        raise ConversionError(f"--cache-length must be between 8 and {dims.n_text_ctx}, not {s}")
    options = {"formats": sorted(formats), "cache_length": s, "palettize": palettize, "converter_revision": CONVERTER_REVISION}

    with FileLock(str(lock_path)):
        if not force and _up_to_date(out, resolved.sha256, options):
            say(f"{out} is up to date")
            return out
        # Under the lock no other conversion of this bundle runs: leftovers of killed ones are garbage.
        for stale in [*out.parent.glob(f".{out.name}.partial-*"), *out.parent.glob(f".{out.name}.old-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        tmp.chmod(0o755)
        try:
            with heap_keeps_large_blocks():  # the build allocates and frees the same large arrays many times
                _build(ckpt, resolved, tmp, formats, s, palettize, tokenizer_dir, options, say)
            if out.exists():
                trash = out.with_name(f".{out.name}.old-{os.getpid()}")
                os.replace(out, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {out}")
    return out


def _up_to_date(out: Path, source_sha: str, options: dict) -> bool:
    cfg_path = out / CONFIG_NAME
    if not cfg_path.is_file():
        return False
    try:
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("contract_version") != CONTRACT_VERSION or cfg.get("source", {}).get("sha256") != source_sha:
            return False
        if cfg.get("conversion_options") != options:
            return False
        verify_bundle(out, cfg)
    except (ValueError, ModelError):
        return False
    return True


def _build(ckpt, resolved, tmp: Path, formats, s: int, palettize, tokenizer_dir, options: dict, say) -> None:
    dims = ckpt.dims
    t0 = time.time()
    tok = build_tokenizer_json(
        resolved.path if resolved.format != "openai" else resolved.path.parent,
        resolved.format,
        tokenizer_dir=Path(tokenizer_dir) if tokenizer_dir else None,
        n_vocab=dims.n_vocab,
    )
    tokens = token_config(tok, multilingual=dims.is_multilingual)
    (tmp / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))

    torch.set_grad_enabled(False)
    say("building torch modules")
    mel = modules.MelSpectrogram(dims.n_mels).eval()
    # ONNX gets the BTC layout (MatMuls ONNX Runtime fuses and quantizes) and its fused encoder attention, Core ML
    # the ANE layout.
    layout = "btc" if "onnx" in formats else "ane"
    encoder = modules.build_encoder(ckpt, sdpa="mha" if layout == "btc" else "chunked", layout=layout)
    decoder = modules.build_decoder(ckpt, modules.TextDecoder, sdpa="einsum", layout=layout)
    eot = tokens["special_tokens"]["eot"]
    sequence = modules.build_decoder(ckpt, modules.TextDecoderSequence, sdpa="einsum", layout=layout, text_vocab=eot)

    say("computing the prefill table")
    special = tokens["special_tokens"]
    lang_ids = list(tokens["languages"].values()) if tokens["multilingual"] else []
    task_ids = [special["transcribe"], special["translate"]] if tokens["multilingual"] else []
    # torch's fused attention: the noise windows go through the encoder faster than in the exported form
    with modules.attention(encoder, "fused"):
        enc_k, enc_v = random_encoder_outputs(encoder, mel)
    key_table, value_table = compute_prefill_table(sequence, enc_k, enc_v, special["sot"], lang_ids, task_ids, s)
    prefill = modules.TextDecoderContextPrefill(key_table, value_table, lang_ids[0] if lang_ids else 0, max(1, len(lang_ids)))

    components: dict[str, dict[str, str]] = {}
    if "onnx" in formats:
        components = _export_onnx(tmp, dims, s, mel, encoder, decoder, sequence, prefill, say)
    if "coreml" in formats:
        from . import export_coreml

        if layout != "ane":
            encoder = modules.build_encoder(ckpt, sdpa="chunked", layout="ane")
            decoder = modules.build_decoder(ckpt, modules.TextDecoder, sdpa="einsum", layout="ane")
        for name, rel in export_coreml.export_all(
            tmp, dims, s, mel=mel, encoder=encoder, decoder=decoder, prefill=prefill, palettize=palettize, say=say
        ).items():
            components.setdefault(name, {}).update(rel)

    extra = {"prefill_length": int(key_table.shape[-1]), **tokens, "components": components, "conversion_options": options}
    config = _config(tmp, ckpt, resolved, s, palettize, extra, time.time() - t0)
    (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")


def _export_onnx(tmp: Path, dims, s: int, mel, encoder, decoder, sequence, prefill, say) -> dict[str, dict[str, str]]:
    """The ONNX components and their int8 variants; returns the config's ``components`` entries."""
    components: dict[str, dict[str, str]] = {}
    for name, export in (
        ("MelSpectrogram", lambda p, **kw: export_onnx.export_mel(mel, p)),
        ("AudioEncoder", lambda p, **kw: export_onnx.export_encoder(encoder, dims, p, **kw)),
        ("TextDecoder", lambda p, **kw: export_onnx.export_decoder(decoder, dims, s, p)),
        ("TextDecoderSequence", lambda p, **kw: export_onnx.export_decoder_sequence(sequence, dims, s, p, **kw)),
        ("TextDecoderContextPrefill", lambda p, **kw: export_onnx.export_prefill(prefill, p)),
    ):
        say(f"exporting {name}.onnx")
        export(tmp / f"{name}.onnx")
        components.setdefault(name, {})["onnx"] = f"{name}.onnx"
        if name in INT8_COMPONENTS:
            say(f"quantizing {name}.int8.onnx")
            # per-layer cross caches: the encoder outputs them and the decoder reads them one layer each
            staged = tmp / f".{name}.per-layer.onnx"
            export(staged, per_layer=True)
            if name == "AudioEncoder":
                quantize.quantize_dynamic_int8(staged, tmp / f"{name}.int8.onnx")
            else:  # the token lookup runs on the host, from a memory-mapped table (quantize.py says why)
                quantize.quantize_int8(staged, tmp / f"{name}.int8.onnx", host_embedding=tmp / TOKEN_EMBEDDING_FILE)
                components[name]["onnx-int8-embedding"] = TOKEN_EMBEDDING_FILE
            staged.unlink()
            components[name]["onnx-int8"] = f"{name}.int8.onnx"
    return components


def _config(tmp: Path, ckpt, resolved, s: int, palettize, extra: dict, seconds: float) -> dict:
    """config.json: the contract version, dims, tokens, components and a sha256 of every file written."""
    files = sorted(str(p.relative_to(tmp)) for p in tmp.iterdir() if p.name != CONFIG_NAME and not p.name.startswith("."))
    coreml_precision = "float16 (mel float32)" + (f", palettized {palettize}-bit" if palettize else "")
    return {
        "contract_version": CONTRACT_VERSION,
        "name": tmp.name.split(".partial-")[0].lstrip("."),
        "dims": ckpt.dims.to_dict(),
        "cache_length": s,
        "prefill_length": extra["prefill_length"],
        **{k: v for k, v in extra.items() if k not in ("prefill_length", "components", "conversion_options")},
        "alignment_heads": [list(h) for h in ckpt.alignment_heads],
        "components": extra["components"],
        "precision": {"onnx": "float32", "onnx-int8": INT8_PRECISION, "coreml": coreml_precision},
        "conversion_options": extra["conversion_options"],
        "source": {"origin": resolved.origin, "format": resolved.format, "path": str(resolved.path), "sha256": resolved.sha256},
        "files": {f: file_sha256(tmp / f) for f in files},
        "created_by": f"whisperane {__version__}",
        "conversion_seconds": round(seconds, 1),
    }
