"""Reader for CTranslate2 ``model.bin`` files (the faster-whisper format), numpy only.

Layout: ``u32 version; str spec; u32 revision; u32 n; n x {str name; u8 rank; u32 dims[rank]; u8 dtype;
u32 nbytes; data}; u32 n_alias; n_alias x {str alias; str target}`` where ``str`` is a u16 length (with the
trailing NUL) followed by the bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..errors import ModelError

_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


class _Reader:
    def __init__(self, data: memoryview, path: Path):
        self.data = data
        self.pos = 0
        self.path = path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise ModelError(f"{self.path}: truncated CTranslate2 model file (needs {self.pos + n} bytes, has {len(self.data)})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return struct.unpack("<H", self.take(2))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def string(self) -> str:
        n = self.u16()
        return bytes(self.take(n)).rstrip(b"\0").decode("utf-8", errors="replace")


def read_ctranslate2_model(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """Return (spec name, {variable name: array}) with aliases resolved. bf16 is widened to f32."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ModelError(f"{path}: cannot read checkpoint ({e.strerror or e})") from None
    r = _Reader(memoryview(raw), path)
    version = r.u32()
    if version < 1 or version > 100:
        raise ModelError(f"{path}: not a CTranslate2 model file (bad version {version})")
    spec = r.string()
    r.u32()  # revision
    n = r.u32()
    variables: dict[str, np.ndarray] = {}
    for _ in range(n):
        name = r.string()
        rank = r.u8()
        shape = tuple(r.u32() for _ in range(rank))
        code = r.u8()
        nbytes = r.u32()
        buf = r.take(nbytes)
        if code not in _DTYPES:
            raise ModelError(f"{path}: unknown dtype code {code} for variable {name}")
        if code == 5:
            u16 = np.frombuffer(buf, dtype=np.uint16)
            arr = (u16.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=_DTYPES[code])
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ModelError(f"{path}: variable {name} has {arr.size} values for shape {shape}")
        variables[name] = arr.reshape(shape)
    if r.pos < len(raw):
        for _ in range(r.u32()):
            alias, target = r.string(), r.string()
            if target in variables:
                variables[alias] = variables[target]
    return spec, variables
