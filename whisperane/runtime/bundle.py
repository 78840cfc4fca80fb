"""Model bundles on disk (docs/DESIGN.md §3): locating, reading and verifying them. Shared by both sides."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..contract import CONFIG_NAME, CONTRACT_VERSION, CONVERTER_REVISION
from ..dims import ModelDimensions
from ..errors import ModelError
from ..util import atomic_write, default_cache_dir, file_sha256


def default_models_dir() -> Path:
    """``$WHISPERANE_MODELS``, else ``./models`` when it exists (a checkout), else the user cache."""
    env = os.environ.get("WHISPERANE_MODELS")
    if env:
        return Path(env)
    local = Path("models")
    if local.is_dir():
        return local
    return default_cache_dir() / "models"


def bundle_name(source: str | os.PathLike) -> str:
    """The directory name under the models directory for a model name, hub id or checkpoint path."""
    name = Path(str(source).rstrip("/")).name if os.path.exists(source) else str(source)
    return name.replace("/", "--").removesuffix(".pt")


def rebuild_command(cfg: dict | None, bundle: Path) -> str:
    source = (cfg or {}).get("source", {})
    name = (cfg or {}).get("name") or bundle.name
    src = source.get("origin", "").startswith("local:") and source.get("path") or name
    return f"whisperane convert {src} --out {bundle} --force"


def read_config(bundle: Path) -> dict:
    path = bundle / CONFIG_NAME
    if not bundle.is_dir():
        raise ModelError(f"{bundle}: no model bundle here; build one with: whisperane convert {bundle.name}")
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError(
            f"{path}: missing (the bundle is incomplete); rebuild it with: {rebuild_command(None, bundle)}"
        ) from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: unreadable ({e}); rebuild it with: {rebuild_command(None, bundle)}") from None
    version = cfg.get("contract_version")
    if version != CONTRACT_VERSION:
        raise ModelError(
            f"{bundle}: bundle contract version {version} but this whisperane reads version {CONTRACT_VERSION}; "
            f"rebuild it with: {rebuild_command(cfg, bundle)}"
        )
    revision = (cfg.get("conversion_options") or {}).get("converter_revision")
    if not isinstance(revision, int) or revision < CONVERTER_REVISION:
        raise ModelError(f"{bundle}: made by converter revision {revision}, older than this whisperane's "
                         f"{CONVERTER_REVISION}; rebuild it with: {rebuild_command(cfg, bundle)}")
    return cfg


VERIFIED_STAMP = ".verified.json"


def _stat_key(path: Path) -> list[int]:
    """Size and modification time of a file or of every file in a package directory."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [v for f in files for st in (f.stat(),) for v in (st.st_size, st.st_mtime_ns)]


def verify_bundle(bundle: Path, cfg: dict, names: list[str] | None = None, use_stamp: bool = False) -> None:
    """Check the sha256 of the listed files (all when ``names`` is None): missing, truncated, tampered.

    With ``use_stamp``, a file whose size and mtime still match the last successful check is not hashed again
    (hashing a large bundle costs more than loading it); any write to a file changes its mtime.
    """
    files: dict[str, str] = cfg.get("files") or {}
    stamp_path = bundle / VERIFIED_STAMP
    stamp: dict = {}
    if use_stamp:
        try:
            stamp = json.loads(stamp_path.read_text())
        except (OSError, ValueError):
            stamp = {}
    fresh: dict = {}
    for rel in names if names is not None else list(files):
        expected = files.get(rel)
        path = bundle / rel
        if expected is None:
            raise ModelError(f"{path}: not listed in {CONFIG_NAME}; rebuild with: {rebuild_command(cfg, bundle)}")
        if not path.exists():
            raise ModelError(f"{path}: missing; rebuild the bundle with: {rebuild_command(cfg, bundle)}")
        key = _stat_key(path)
        if use_stamp and stamp.get(rel) == [expected, key]:
            fresh[rel] = stamp[rel]
            continue
        if file_sha256(path) != expected:
            raise ModelError(
                f"{path}: checksum mismatch (corrupted or modified); rebuild the bundle with: {rebuild_command(cfg, bundle)}"
            )
        if rel == "tokenizer.json":
            check_tokenizer(path, cfg, bundle)
        fresh[rel] = [expected, key]
    if use_stamp and fresh != {k: stamp.get(k) for k in fresh}:
        try:  # best effort: a read-only bundle is simply hashed on every load
            atomic_write(stamp_path, lambda f: f.write(json.dumps({**stamp, **fresh}).encode()))
        except OSError:
            pass


# config.json's special_tokens keys and the token text each may have in tokenizer.json's added_tokens.
_SPECIAL_TEXT = {
    "eot": ("<|endoftext|>",),
    "sot": ("<|startoftranscript|>",),
    "transcribe": ("<|transcribe|>",),
    "translate": ("<|translate|>",),
    "no_timestamps": ("<|notimestamps|>",),
    "no_speech": ("<|nospeech|>", "<|nocaptions|>"),
}


def check_tokenizer(path: Path, cfg: dict, bundle: Path) -> None:
    """Check that tokenizer.json belongs to this model: its special tokens have the ids config.json gives them.

    A tokenizer swapped in from another model (with the checksum in config.json updated to match) would
    otherwise load and decode every token as a different word.
    """
    try:
        added = json.loads(path.read_text(encoding="utf-8")).get("added_tokens") or []
        ids = {t["content"]: int(t["id"]) for t in added}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ModelError(f"{path}: unreadable ({e}); rebuild the bundle with: {rebuild_command(cfg, bundle)}") from None
    expected = dict(cfg.get("special_tokens") or {})
    expected.update({f"<|{code}|>": tid for code, tid in (cfg.get("languages") or {}).items()})
    for key, want in expected.items():
        names = _SPECIAL_TEXT.get(key, (key,) if key.startswith("<|") else ())
        found = [ids[n] for n in names if n in ids]
        if found and want not in found:
            raise ModelError(
                f"{path}: does not match the model ({names[0]} is token {found[0]} here but {want} in {CONFIG_NAME}: "
                f"a tokenizer from another model?); rebuild the bundle with: {rebuild_command(cfg, bundle)}"
            )


@dataclass(frozen=True)
class BundleInfo:
    """What the run side needs from config.json."""

    path: Path
    config: dict
    dims: ModelDimensions
    cache_length: int
    prefill_length: int
    multilingual: bool
    special_tokens: dict
    languages: dict
    alignment_heads: tuple[tuple[int, int], ...]
    suppress_tokens: tuple[int, ...]
    suppress_blank_tokens: tuple[int, ...] | None  # None: computed from the tokenizer (" " and eot)

    @classmethod
    def load(cls, bundle: Path) -> BundleInfo:
        cfg = read_config(bundle)
        try:
            return cls(
                path=bundle,
                config=cfg,
                dims=ModelDimensions.from_dict(cfg["dims"]),
                cache_length=int(cfg["cache_length"]),
                prefill_length=int(cfg["prefill_length"]),
                multilingual=bool(cfg["multilingual"]),
                special_tokens=dict(cfg["special_tokens"]),
                languages=dict(cfg["languages"]),
                alignment_heads=tuple(tuple(h) for h in cfg["alignment_heads"]),
                suppress_tokens=tuple(cfg["suppress_tokens"]),
                suppress_blank_tokens=tuple(cfg["suppress_blank_tokens"]) if "suppress_blank_tokens" in cfg else None,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{bundle / CONFIG_NAME}: malformed ({e}); rebuild with: {rebuild_command(cfg, bundle)}") from None

    def component(self, name: str, variant: str) -> str | None:
        """The bundle-relative path of a component's variant (``onnx``, ``onnx-int8``, ``coreml_stateful``...)."""
        return self.config.get("components", {}).get(name, {}).get(variant)

    def component_file(self, name: str, variant: str) -> Path | None:
        rel = self.component(name, variant)
        return None if rel is None else self.path / rel
