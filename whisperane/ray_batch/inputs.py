"""The inputs of ``whisperane batch``: a directory, a glob or a manifest, read into one Arrow table.

The table has a ``path`` column of absolute paths (one row per file; a path listed twice is kept once) and,
for a manifest, its other columns with their values as given: JSONL values as JSON types, CSV values as
strings, Parquet columns with their Parquet types. Relative paths in a manifest are taken relative to the
manifest's directory, so a manifest can be moved together with its audio.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from pathlib import Path

import pyarrow as pa

from ..audio import AUDIO_EXTENSIONS
from ..errors import WhisperaneError

MANIFEST_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


def read_inputs(spec: str) -> pa.Table:
    """The files ``spec`` names: a directory (searched recursively for audio), a manifest (.jsonl, .csv,
    .parquet with a ``path`` column), a single file, or a glob (``**`` recurses; audio files only)."""
    p = Path(spec)
    if p.is_dir():
        found = sorted(str(f.resolve()) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in AUDIO_EXTENSIONS)
        if not found:
            raise WhisperaneError(f"{spec}: directory holds no audio files")
        return pa.table({"path": pa.array(found, pa.string())})
    if p.is_file() and p.suffix.lower() in MANIFEST_SUFFIXES:
        return _resolve_paths(read_manifest(p), p.resolve().parent, spec)
    if p.is_file():
        return pa.table({"path": pa.array([str(p.resolve())], pa.string())})
    if glob.has_magic(spec):
        matches = sorted(
            os.path.abspath(m) for m in glob.glob(spec, recursive=True)
            if os.path.isfile(m) and Path(m).suffix.lower() in AUDIO_EXTENSIONS
        )
        if not matches:
            raise WhisperaneError(f"{spec}: the glob matches no audio files")
        return pa.table({"path": pa.array(matches, pa.string())})
    raise WhisperaneError(f"{spec}: no such file or directory")


def read_manifest(path: Path) -> pa.Table:
    """The manifest's rows as a table (columns as the file has them); one-line errors for a bad manifest."""
    kind = MANIFEST_SUFFIXES[path.suffix.lower()]
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        elif kind == "csv":
            with open(path, newline="", encoding="utf-8") as f:
                table = pa.Table.from_pylist(list(csv.DictReader(f)))
        else:
            table = pa.Table.from_pylist(_jsonl_rows(path))
    except (OSError, UnicodeDecodeError, pa.ArrowException, csv.Error) as e:
        raise WhisperaneError(f"{path}: cannot read the {kind.upper()} manifest ({type(e).__name__}: {e})") from None
    if "path" not in table.column_names:
        raise WhisperaneError(f"{path}: the manifest has no 'path' column (columns: {', '.join(table.column_names) or 'none'})")
    if not pa.types.is_string(table.schema.field("path").type) and not pa.types.is_large_string(table.schema.field("path").type):
        raise WhisperaneError(f"{path}: the manifest's 'path' column holds {table.schema.field('path').type}, not strings")
    return table


def _jsonl_rows(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise WhisperaneError(f"{path}:{number}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise WhisperaneError(f"{path}:{number}: expected a JSON object with a 'path', got {type(row).__name__}")
            rows.append(row)
    return rows


def _resolve_paths(table: pa.Table, base: Path, spec: str) -> pa.Table:
    """Absolute paths in ``path``; rows without a path are an error, a path listed again is dropped."""
    listed = table.column("path").to_pylist()
    resolved: list[str] = []
    keep: list[int] = []
    seen: set[str] = set()
    for index, value in enumerate(listed):
        if not value:
            raise WhisperaneError(f"{spec}: row {index + 1} has no path")
        absolute = os.path.normpath(os.path.join(base, os.path.expanduser(value)))
        if absolute not in seen:
            seen.add(absolute)
            keep.append(index)
            resolved.append(absolute)
    table = table.take(pa.array(keep, pa.int64())) if len(keep) < len(listed) else table
    return table.set_column(table.column_names.index("path"), "path", pa.array(resolved, pa.string()))


def rename_clashes(names: list[str], reserved: tuple[str, ...]) -> dict[str, str]:
    """Input columns named like a result column (a reference ``text``, a known ``language``) are kept as
    ``input_<name>``, so no input value is overwritten by a result."""
    renames = {}
    for name in names:
        if name in reserved:
            new = f"input_{name}"
            while new in names or new in renames.values():
                new = f"input_{new}"
            renames[name] = new
    return renames
