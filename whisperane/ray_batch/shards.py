"""The output of ``whisperane batch``: a directory of JSONL or Parquet shards, written atomically, and what a
re-run reads back from them to resume.

A shard is written under a hidden temporary name and renamed into place once complete, so every
``part-*.jsonl`` / ``part-*.parquet`` in the directory is whole: a killed run leaves at most a hidden
temporary file, which the next run deletes and never counts. A row is done when a shard holds it; it is
keyed by its absolute ``path`` and the ``sha256`` of the file's content.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ..errors import WhisperaneError
from ..util import TEMP_GLOB, atomic_write, file_sha256

WORD_TYPE = pa.struct([
    ("word", pa.string()), ("start", pa.float64()), ("end", pa.float64()), ("probability", pa.float64()),
    ("speaker", pa.string()),  # --diarize's label, null without
])
SEGMENT_TYPE = pa.struct([
    ("id", pa.int64()), ("seek", pa.int64()), ("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
    ("tokens", pa.list_(pa.int64())), ("temperature", pa.float64()), ("avg_logprob", pa.float64()),
    ("compression_ratio", pa.float64()), ("no_speech_prob", pa.float64()), ("words", pa.list_(WORD_TYPE)),
    ("speaker", pa.string()),
])
SPEAKER_TYPE = pa.struct([("speaker", pa.string()), ("duration", pa.float64())])
TURN_TYPE = pa.struct([("speaker", pa.string()), ("start", pa.float64()), ("end", pa.float64())])
# The columns each row gets after the input's own: the result JSON of transcribe() (null for a failed file),
# the one-line error (null for a good one), the content hash and what produced the row.
RESULT_SCHEMA = pa.schema([
    ("text", pa.string()), ("language", pa.string()), ("duration", pa.float64()),
    ("language_probs", pa.map_(pa.string(), pa.float64())), ("segments", pa.list_(SEGMENT_TYPE)),
    ("speakers", pa.list_(SPEAKER_TYPE)), ("speaker_turns", pa.list_(TURN_TYPE)),  # --diarize's, null without
    ("error", pa.string()), ("sha256", pa.string()), ("model", pa.string()), ("options", pa.string()),
])
RESULT_COLUMNS = tuple(RESULT_SCHEMA.names)
FORMATS = {"jsonl": ".jsonl", "parquet": ".parquet"}
RUN_FILE = "_whisperane_batch.json"  # the model and options a directory's rows were made with
SHARD_PREFIX = "part-"


def row_json(row: dict) -> dict:
    """A row as the JSON the JSONL shards hold: maps back to objects, ``words`` and the speaker fields left out
    when not computed (as in transcribe()'s JSON)."""
    probs = row.get("language_probs")
    if isinstance(probs, list):
        row["language_probs"] = dict(probs)
    for key in ("speakers", "speaker_turns"):
        if row.get(key) is None:
            row.pop(key, None)
    for segment in row.get("segments") or ():
        if segment.get("words") is None:
            segment.pop("words", None)
        for item in (segment, *(segment.get("words") or ())):
            if item.get("speaker", 0) is None:
                item.pop("speaker")
    return row


def write_shard(path: Path, table: pa.Table) -> None:
    """Write ``table`` as the JSONL or Parquet shard ``path``, atomically."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        atomic_write(path, lambda f: pq.write_table(table, f))
        return
    lines = "".join(json.dumps(row_json(row), ensure_ascii=False) + "\n" for row in table.to_pylist())
    atomic_write(path, lambda f: f.write(lines.encode("utf-8")))


def _shard_keys(path: Path) -> list[tuple[str, str | None, str | None]]:
    """(path, sha256, error) of each row of a shard: all that resuming needs, not the transcripts."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["path", "sha256", "error"])
        return list(zip(*(table.column(c).to_pylist() for c in ("path", "sha256", "error")), strict=True))
    keys = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                keys.append((row["path"], row.get("sha256"), row.get("error")))
    return keys


@dataclass(frozen=True)
class Done:
    """A file's row in a complete shard."""

    shard: Path
    sha256: str | None
    error: str | None


def read_shard(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [row_json(r) for r in pq.read_table(path).to_pylist()]
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class OutputDir:
    """The shards of one output directory and the rows they hold, keyed by path."""

    root: Path
    fmt: str
    rows: dict[str, Done] = field(default_factory=dict)
    run_id: str = field(default_factory=lambda: f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    written: int = 0

    @classmethod
    def open(cls, root: Path, fmt: str, settings: dict) -> OutputDir:
        """Create or reopen ``root``: stale temporary files go, and the model and options must be those the
        directory's rows were made with (mixing them would make "done" mean two things)."""
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(TEMP_GLOB):
            stale.unlink(missing_ok=True)
        run_file = root / RUN_FILE
        settings = {"format": fmt, **settings}
        if run_file.is_file():
            before = json.loads(run_file.read_text(encoding="utf-8"))
            if before != settings:
                changed = ", ".join(k for k in sorted(set(before) | set(settings)) if before.get(k) != settings.get(k))
                raise WhisperaneError(
                    f"{root}: holds results made with another {changed}; re-run with the same settings to resume, "
                    "or write to a new --output directory"
                )
        else:
            atomic_write(run_file, lambda f: f.write(json.dumps(settings, indent=1, sort_keys=True).encode()))
        out = cls(root, fmt)
        for shard in sorted(root.glob(f"{SHARD_PREFIX}*{FORMATS[fmt]}")):
            for path, sha256, error in _shard_keys(shard):
                out.rows[path] = Done(shard, sha256, error)
        return out

    def write(self, table: pa.Table) -> Path:
        self.written += 1
        path = self.root / f"{SHARD_PREFIX}{self.run_id}-{self.written:05d}{FORMATS[self.fmt]}"
        write_shard(path, table)
        return path

    def drop(self, paths: set[str]) -> None:
        """Take the rows of ``paths`` out of their shards (each shard rewritten atomically, deleted when
        empty), so that redoing them leaves one row per file."""
        shards = {self.rows[p].shard for p in paths if p in self.rows}
        for shard in shards:
            if shard.suffix == ".parquet":
                import pyarrow.compute as pc
                import pyarrow.parquet as pq

                table = pq.read_table(shard)
                kept = table.filter(pc.invert(pc.is_in(table["path"], pa.array(sorted(paths), pa.string()))))
            else:
                kept = [row for row in read_shard(shard) if row["path"] not in paths]
            if len(kept) == 0:
                shard.unlink()
            elif isinstance(kept, pa.Table):
                write_shard(shard, kept)
            else:
                lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept)
                atomic_write(shard, lambda f, text=lines: f.write(text.encode("utf-8")))
        for p in paths:
            self.rows.pop(p, None)


def plan(out: OutputDir, paths: list[str], retry_errors: bool) -> tuple[list[str], list[str]]:
    """Split ``paths`` into those to transcribe and those whose rows stand: a good row stands while its file
    has the same content hash; an error row stands unless ``retry_errors``. Rows about to be redone are
    dropped from their shards first."""
    todo, done = [], []
    redo: set[str] = set()
    for path in paths:
        previous = out.rows.get(path)
        if previous is None:
            todo.append(path)
            continue
        if previous.error is not None:
            stands = not retry_errors
        else:
            try:
                stands = file_sha256(path) == previous.sha256
            except OSError:
                stands = False
        (done if stands else todo).append(path)
        if not stands:
            redo.add(path)
    out.drop(redo)
    return todo, done
