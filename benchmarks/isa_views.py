"""Copies of the installed onnxruntime that run the kernels of a CPU with fewer instruction-set extensions (issue 62):
on an AVX-512 host, the kernels an AVX2-only CPU (AMD Zen 2/3, Intel before Alder Lake) or an AVX2 + AVX-VNNI CPU
(Intel client chips since Alder Lake) would run, for timing each kernel path on one machine.

ONNX Runtime's MLAS chooses its kernels once, from CPUID, when the library loads (``MLAS_PLATFORM``'s constructor in
``onnxruntime/core/mlas/lib/platform.cpp``) and offers no switch. Each view is a copy of the package whose
``onnxruntime_pybind11_state`` has two conditional jumps of that constructor made unconditional (the AVX-512F
block and, for ``avx2``, the AVX-VNNI block are passed over), and ``CPUIDInfo`` told that the OS saves no AVX-512
state. The offsets are those of onnxruntime 1.32.0's Linux x86-64 wheel; each patch checks the bytes it replaces
and the script refuses any other version. A view reports its own ``__version__`` (``1.32.0+avx2-view``), so the
optimized-graph cache whisperane keeps beside a bundle (keyed by ONNX Runtime's version and the CPU's flags) is
not shared with the native library, whose prepacked weights have another layout.

    python benchmarks/isa_views.py [--out ~/.cache/whisperane/isa-views]    # then, e.g.:
    PYTHONPATH=~/.cache/whisperane/isa-views/avx2 whisperane transcribe examples/jfk.flac

faster-whisper's CTranslate2 has its own switch: ``CT2_FORCE_CPU_ISA=AVX2``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

VERSION = "1.32.0"
LIBRARY = "capi/onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so"
# (file offset, bytes there, bytes written): je -> jmp over MLAS's AVX-512F block and over its AVX-VNNI block;
# CPUIDInfo's "sete r9b" (XCR0 has the ZMM state) -> four nops
SKIP_AVX512 = (0x1724664, b"\x74\x0e", b"\xeb\x0e")
SKIP_AVX_VNNI = (0x1724623, b"\x74\x38", b"\xeb\x38")
NO_AVX512_STATE = (0x1B71D03, b"\x41\x0f\x94\xc1", b"\x90\x90\x90\x90")
VIEWS = {"avx2vnni": (SKIP_AVX512, NO_AVX512_STATE), "avx2": (SKIP_AVX512, NO_AVX512_STATE, SKIP_AVX_VNNI)}
DEFAULT_OUT = Path.home() / ".cache" / "whisperane" / "isa-views"


def make_view(name: str, out: Path) -> Path:
    """The view ``name`` under ``out`` (its directory goes first on PYTHONPATH)."""
    import onnxruntime

    if onnxruntime.__version__ != VERSION:
        raise SystemExit(f"isa_views: onnxruntime {onnxruntime.__version__} installed; the patches are for {VERSION}")
    package = out / name / "onnxruntime"
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(Path(onnxruntime.__file__).parent, package)
    library = bytearray((package / LIBRARY).read_bytes())
    for offset, old, new in VIEWS[name]:
        if bytes(library[offset : offset + len(old)]) != old:
            raise SystemExit(f"isa_views: unexpected bytes at {offset:#x} of {LIBRARY}")
        library[offset : offset + len(old)] = new
    (package / LIBRARY).write_bytes(bytes(library))
    init = package / "__init__.py"
    init.write_text(init.read_text() + f"__version__ = __version__ + '+{name}-view'\n")
    return out / name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    for name in VIEWS:
        print(f"{name}: PYTHONPATH={make_view(name, args.out)}")


if __name__ == "__main__":
    main()
