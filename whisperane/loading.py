"""Loading a model, in one pass: resolve the name or path -> convert if missing -> verify -> pick the compute
type and the decoder adapter -> open the sessions. Every variant is decided here, once."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .contract import CONFIG_NAME
from .errors import ModelError
from .runtime.bundle import BundleInfo, bundle_name, default_models_dir, verify_bundle
from .runtime.executors import release_freed_memory
from .runtime.model import WhisperaneModel
from .runtime.sessions import IdleWeights, Sessions, Wrap, choose_kind, open_decoder
from .tokenizer import Tokenizer


def open_model(name_or_path: str | os.PathLike = "tiny.en", executor: str = "onnx", threads: int | None = None,
               compute_units: str = "ALL", compute_type: str = "default", verify: bool = True,
               encoder_threads: int | None = None, wrap: Wrap | None = None,
               model_class: type[WhisperaneModel] = WhisperaneModel) -> WhisperaneModel:
    """Load a bundle by model name (converted on first use) or directory, as ``model_class`` (users get
    ``whisperane.transcribe.Whisper``, which transcribes, through ``whisperane.load_model``).

    ``compute_type``: "int8" (int8 encoder and decoder weights), "float32", or "default" (int8 on the CPU with
    ONNX Runtime when the bundle has it, as faster-whisper's int8; float32 elsewhere). ``threads``: the
    executor's threads per call (default: ``$WHISPERANE_THREADS``, else all cores); ``encoder_threads``: the
    AudioEncoder's and the log-mel's (default: ``threads``). ``wrap(role, component, reopen)``: what each
    component is wrapped in as it opens (``runtime.sessions.Wrap``); by default ``IdleWeights``, each component's
    weights out of the resident set while another runs; ``keep_resident`` keeps them all. A caller that
    schedules requests over the model passes its own (a server's: ``whisperane.server.scheduling``)."""
    bundle = resolve_bundle(name_or_path)
    info = BundleInfo.load(bundle)
    kind = choose_kind(info, executor, compute_type)
    if verify:
        verify_bundle(bundle, info.config, kind.verified_files(), use_stamp=True)
    threads = threads or int(os.environ.get("WHISPERANE_THREADS", "0")) or None
    with ThreadPoolExecutor(max_workers=1) as pool:  # the tokenizer is read while the sessions open
        tokenizer = pool.submit(Tokenizer.from_files, bundle / "tokenizer.json", info.special_tokens,
                                info.languages, info.multilingual)
        sessions = Sessions(bundle, kind, threads, compute_units, encoder_threads or threads, wrap or IdleWeights())
        decoder = open_decoder(kind, info, sessions)
        model = model_class(info, kind, sessions, decoder, tokenizer.result())
    release_freed_memory()
    return model


def resolve_bundle(name_or_path: str | os.PathLike, convert_missing: bool = True) -> Path:
    """A bundle directory for a model name or path; converts the named model on first use (the one import of
    the build side from the run side, made only then)."""
    p = Path(name_or_path)
    if p.is_dir() and (p / CONFIG_NAME).is_file():
        return p
    candidate = default_models_dir() / bundle_name(name_or_path)
    if (candidate / CONFIG_NAME).is_file():
        return candidate
    if not convert_missing:
        raise ModelError(f"no bundle for {name_or_path!r} in {candidate.parent}; build it with: whisperane convert {name_or_path}")
    try:
        from .convert.command import conversion_report
        from .convert.pipeline import convert
    except ImportError as e:
        raise ModelError(
            f"model {name_or_path!r} is not converted yet and the build side is not installed ({e.name} missing); "
            "install with: pip install torch==2.13.0 'whisperane[convert]'"
        ) from None
    report = conversion_report(sys.stderr.isatty())  # a bar on a terminal, else a line per step
    try:
        return convert(str(name_or_path), progress=report)
    finally:
        report.close()
