"""The run side's table of each token's bytes, kept beside the ``tokenizer.json`` it was built from (named by the
JSON's size and CRC-32): parsing the JSON costs a short file's run more than its own time, holding the interpreter
while the encoder's first window runs, and leaves its garbage in the heap. A bundle that cannot be written keeps
none and parses its JSON at each load."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from .util import atomic_write

TABLE_PREFIX = ".tokenizer-table-"
TABLE_MAGIC = b"WTT1"


def table_path(tokenizer_json: Path, raw: bytes) -> Path:
    """Where the table of ``tokenizer_json`` (whose bytes are ``raw``) is kept."""
    return tokenizer_json.with_name(f"{TABLE_PREFIX}{len(raw)}-{zlib.crc32(raw):08x}.bin")


def read_table(path: Path) -> list[bytes] | None:
    """The table a ``write_table`` file holds, or None (absent, unreadable or damaged)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    n = int.from_bytes(data[4:8], "little")
    try:
        ends = np.frombuffer(data, dtype="<u4", count=n, offset=8).tolist() if data[:4] == TABLE_MAGIC else None
    except ValueError:  # shorter than its offsets
        return None
    blob = memoryview(data)[8 + 4 * n :]
    if ends is None or (ends[-1] if ends else 0) != len(blob):
        return None
    return [bytes(blob[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def write_table(path: Path, table: list[bytes]) -> None:
    """``table`` as TABLE_MAGIC, its length, each token's end offset (uint32) and the bytes; written atomically,
    older tables beside it removed. A directory that cannot be written keeps no table."""
    ends = np.cumsum([len(t) for t in table], dtype=np.uint64).astype("<u4")
    try:
        atomic_write(path, lambda f: f.write(TABLE_MAGIC + len(table).to_bytes(4, "little") + ends.tobytes()
                                             + b"".join(table)))
        for stale in path.parent.glob(f"{TABLE_PREFIX}*.bin"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError:
        pass


__all__ = ["TABLE_PREFIX", "read_table", "table_path", "write_table"]
