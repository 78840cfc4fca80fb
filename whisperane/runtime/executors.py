"""Executors: run one compiled component by tensor name. ONNX Runtime everywhere, Core ML on macOS.

Both run the same components with the same tensor names, so everything above this module is executor-agnostic.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import platform
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import ModelError
from ..util import sha256_bytes


class Component(Protocol):
    name: str
    inputs: dict[str, tuple]  # name -> shape (ints or symbolic names)
    outputs: dict[str, tuple]

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Named outputs for named inputs; ``outputs`` limits what is returned (and, where the executor can,
        what is computed)."""
        ...

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        """Write the named outputs into the given C-contiguous arrays (of the outputs' shapes and dtypes): in
        place where the executor can (ONNX Runtime's I/O binding), else computed and copied."""
        ...

    def release_weights(self) -> None:
        """Take the component's weights out of the process's resident set until its next run, where the
        executor can do so without a copy (ONNX Runtime's mapped weights file); a no-op elsewhere."""
        ...


def _ort():
    try:
        import onnxruntime
    except ImportError:  # pragma: no cover - a dependency
        raise ModelError("onnxruntime is not installed: pip install onnxruntime") from None
    return onnxruntime


def _optimized_cache_dir(path: Path, ort) -> Path:
    """Where the session's optimized graph is kept: per ONNX Runtime version and CPU (the optimized graph may
    use layouts specific to this processor), next to the component, named after its size and mtime so a
    rebuilt component never meets a stale cache."""
    st = path.stat()
    key = sha256_bytes(f"{ort.__version__}|{platform.machine()}|{_cpu_flags()}|{st.st_size}|{st.st_mtime_ns}".encode())[:16]
    return path.parent / ".ort-cache" / f"{path.stem}.{key}"


@functools.cache
def _cpu_flags() -> str:
    """The processor's feature flags (Linux's /proc/cpuinfo; empty elsewhere), read once a process: the file is
    long on a many-core machine."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


CACHED_GRAPH, CACHED_WEIGHTS = "graph.onnx", "weights.data"


_ARENA_LOCK = threading.Lock()
_arena_registered: bool | None = None


def _shared_cpu_arena(ort) -> bool:
    """Register one CPU arena allocator with ONNX Runtime's environment, once per process."""
    global _arena_registered
    with _ARENA_LOCK:
        if _arena_registered is None:
            try:
                info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
                ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
                _arena_registered = True
            except Exception:  # an onnxruntime without the API: sessions keep their own arenas
                _arena_registered = False
        return _arena_registered


class OnnxComponent:
    """One ONNX Runtime session. Inputs are handed over as numpy arrays (no copy for contiguous CPU arrays).

    Graph optimization of a large model costs more than running it once: the first load saves the optimized
    graph (``.ort-cache/`` beside the component) with its weights in an external file, prepacked for this
    CPU's kernels, and later loads map it as it is. A cached ORT-format graph would repack the weights on every
    load: this is faster and lower at the peak, for twice the disk.
    """

    def __init__(self, path: Path, threads: int | None = None, providers: list[str] | None = None,
                 spinning: bool = True):
        ort = _ort()
        available = ort.get_available_providers()
        providers = [p for p in (providers or default_providers()) if p in available] or ["CPUExecutionProvider"]
        cached = _optimized_cache_dir(path, ort) if providers == ["CPUExecutionProvider"] else None
        # only a session opened from the saved graph maps its weights file; another reads it into the heap
        options = functools.partial(self._options, ort, threads, spinning)  # fresh options for each attempt
        self.session, self.mapped_weights = self._open_cached(ort, cached, options()) if cached is not None else (None, None)
        if self.session is None:
            self.session = self._open_and_cache(ort, path, cached, options(), providers)
        self.name = path.stem
        self.inputs = {i.name: tuple(i.shape) for i in self.session.get_inputs()}
        self.outputs = {o.name: tuple(o.shape) for o in self.session.get_outputs()}
        self._output_names = list(self.outputs)

    @classmethod
    def _open_cached(cls, ort, cached: Path, opts):
        """The session from the saved optimized graph, as saved (no optimizer pass), and the mappings of its
        weights file that it made (``MappedWeights``); (None, None) without a usable cache."""
        if not (cached / CACHED_GRAPH).is_file():
            return None, None
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            with _OPENING:  # another session of the same file, opened meanwhile, would map it too
                before = set(file_mappings(cached / CACHED_WEIGHTS))
                session = ort.InferenceSession(str(cached / CACHED_GRAPH), opts, providers=["CPUExecutionProvider"])
                made = [r for r in file_mappings(cached / CACHED_WEIGHTS) if r not in before]
            return session, MappedWeights(made)
        except Exception:  # a damaged cache: removed, and rebuilt from the component
            shutil.rmtree(cached, ignore_errors=True)
            return None, None

    @classmethod
    def _open_and_cache(cls, ort, path: Path, cached: Path | None, opts, providers: list[str]):
        """The session from the component, its optimized graph and prepacked weights saved in a directory that
        is renamed into place whole (a concurrent loader sees all of it or nothing)."""
        work = None
        if cached is not None:
            try:
                cached.parent.mkdir(exist_ok=True)
                work = cached.with_name(f".{cached.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                work.mkdir()
                opts.optimized_model_filepath = str(work / CACHED_GRAPH)
                for key, value in (("session.optimized_model_external_initializers_file_name", CACHED_WEIGHTS),
                                   ("session.optimized_model_external_initializers_min_size_in_bytes", "1024"),
                                   ("session.save_external_prepacked_constant_initializers", "1")):
                    opts.add_session_config_entry(key, value)
            except OSError:  # a read-only bundle: no cache
                work = None
        try:
            session = ort.InferenceSession(str(path), opts, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise ModelError(f"{path}: cannot load ONNX model ({str(e).splitlines()[0][:200]})") from None
        finally:
            if work is not None:
                _move_into_place(work, cached)
                _drop_stale_caches(cached)
        return session

    @staticmethod
    def _options(ort, threads: int | None, spinning: bool):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or 0
        # A session's worker threads spin for a while after each call, waiting for the next one: right for the
        # decoder's back-to-back steps, but a session whose next call is far off spins on a core another session
        # needs (see runtime.sessions.SPINNING_ROLES).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        # Memory: the components run one after another, so their activations share one arena (the process-wide
        # allocator) instead of each session growing its own; and no per-session "memory pattern" block, which
        # for the encoder is a second copy of its largest activations (peak RSS lower, speed unchanged).
        opts.enable_mem_pattern = False
        if _shared_cpu_arena(ort):
            opts.add_session_config_entry("session.use_env_allocators", "1")
        return opts

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        # ONNX Runtime runs every node of the graph whatever outputs are asked for: the graph itself must skip
        # work it is told is not needed (TextDecoderSequence's logit_positions).
        names = outputs or self._output_names
        values = self.session.run(names, feeds)
        return dict(zip(names, values, strict=True))

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name, array in outputs.items():
            if not array.flags.c_contiguous or not array.flags.writeable:
                raise ValueError(f"{self.name}: output {name} must go to a writeable C-contiguous array")
            binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        self.session.run_with_iobinding(binding)

    def release_weights(self) -> None:
        if self.mapped_weights is not None:
            self.mapped_weights.release()


_OPENING = threading.Lock()


class MappedWeights:
    """The mappings of a saved graph's weights file (``weights.data``) that one session made: ONNX Runtime maps
    the file copy-on-write and reads the weights where they lie, file pages that count in the resident set once
    touched although the page cache holds them anyway. ``release`` drops them from this process's page tables
    (``MADV_DONTNEED``), and the next run maps them back from the page cache (the kernel maps up to 16 cached
    pages a fault: tiny.en's decoder, 38 MB, in under a millisecond).

    Dropping pages is only safe where they are the file's. The ranges are those the session made while it
    opened, which stay mapped until the session is freed with its component: another session of the same file
    (a second model loaded from the bundle) has its own, unmapped when that one is freed and their addresses
    reused. And a range is released only if every resident page of it is a file page, checked at the first
    release, after the session's first run: a page written to (copied on write) would lose the write (ONNX
    Runtime does not write to its initializers; none was when measured). Linux only: no mappings are found
    elsewhere."""

    def __init__(self, ranges: list[tuple[int, int]]):
        self._ranges = ranges
        self._checked = False
        self._lock = threading.Lock()

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """The address ranges (start, end) this session's weights are mapped at."""
        return list(self._ranges)

    def release(self) -> None:
        with self._lock:
            if not self._checked:
                self._ranges, self._checked = file_pages_only(self._ranges), True
            madvise = _madvise_dontneed()
            for start, end in self._ranges:
                madvise(start, end - start)


def file_mappings(path: Path) -> list[tuple[int, int]]:
    """The address ranges where this process maps ``path`` (by device and inode, or by path where a filesystem
    such as overlayfs reports others in /proc/self/maps); none where that cannot be read."""
    try:
        st, real = path.stat(), os.path.realpath(path)
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [r for line in lines if (r := _mapped_range(line, st, real)) is not None]


def file_pages_only(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges all of whose resident pages are file pages. /proc/self/pagemap tells, per page: present (bit
    63), swapped (62: only anonymous pages swap), a file page (61); reading it takes a millisecond where
    /proc/self/smaps took 20 (it counts every mapping of the process)."""
    if not ranges:
        return []
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            return [r for r in ranges if _file_pages_only(pagemap, *r)]
    except OSError:
        return []


def _mapped_range(line: str, st: os.stat_result, real: str) -> tuple[int, int] | None:
    """A /proc/self/maps line's address range where it maps the file (``st``, ``real``), else None."""
    fields = line.split(maxsplit=5)
    if len(fields) < 5:
        return None
    major, _, minor = fields[3].partition(":")
    device = os.makedev(int(major, 16), int(minor, 16))
    if (device, int(fields[4])) != (st.st_dev, st.st_ino) and (fields[5:] or [""])[0].strip() != real:
        return None
    start, _, end = fields[0].partition("-")
    return int(start, 16), int(end, 16)


def _file_pages_only(pagemap, start: int, end: int) -> bool:
    page = mmap.PAGESIZE
    pagemap.seek(start // page * 8)
    entries = np.frombuffer(pagemap.read((end - start) // page * 8), dtype=np.uint64)
    present, swapped, file = (entries >> np.uint64(b) & np.uint64(1) for b in (63, 62, 61))
    return not bool(((present & (file ^ np.uint64(1))) | swapped).any())


@functools.cache
def _madvise_dontneed():
    """``madvise(start, length, MADV_DONTNEED)`` through libc, or a no-op where there is none."""
    if sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            call = ctypes.CDLL(None, use_errno=True).madvise
            call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            return lambda start, length: call(start, length, mmap.MADV_DONTNEED)
        except (OSError, AttributeError):
            pass
    return lambda start, length: None


def release_freed_memory() -> None:
    """Hand the C heap's free pages back to the operating system (glibc's ``malloc_trim``; a no-op elsewhere).

    Creating a session parses the model, copies and prepacks its weights and frees the parsed copies; glibc
    keeps freed pages mapped, so they stay in the resident set (measured after loading: 23 MB on tiny.en,
    40 MB on base, returned by this call).
    """
    if trim := _glibc("malloc_trim"):
        trim(0)


# glibc's mallopt parameters: the free space at the heap's top above which it is handed back, the extra space
# asked of the kernel each time the heap grows, and the size from which an allocation gets its own mapping
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# What a parameter is taken to be until this process sets it: glibc's dynamic thresholds grow with the blocks
# freed up to these ceilings (64-bit), and a torch or numpy process soon reaches them; its default top pad.
_GLIBC_DEFAULTS = {M_TRIM_THRESHOLD: 64 << 20, M_TOP_PAD: 128 << 10, M_MMAP_THRESHOLD: 32 << 20}
_MALLOC_OPTIONS: dict[int, int] = {}  # what this process set through set_malloc_option


def set_malloc_option(option: int, value: int) -> None:
    """glibc's ``mallopt(option, value)``, remembered for :func:`heap_keeps_large_blocks`; a no-op elsewhere."""
    if set_option := _glibc("mallopt"):
        set_option(option, value)
        _MALLOC_OPTIONS[option] = value


def map_large_allocations(threshold: int = 128 * 1024) -> None:
    """Every allocation of ``threshold`` bytes or more in a mapping of its own, unmapped when freed (glibc's
    ``mallopt``; a no-op elsewhere). By default glibc raises that threshold to the size of each large block
    freed, so that a process allocating and freeing the same large arrays keeps them in its heaps; a server's
    requests, on several threads, leave those heaps holding the largest of each. Set once, before serving."""
    set_malloc_option(M_MMAP_THRESHOLD, threshold)


@contextlib.contextmanager
def heap_keeps_large_blocks(largest_block: int = 1 << 30, trim: int = 4 << 30, top_pad: int = 256 << 20):
    """Inside: blocks up to ``largest_block`` bytes come from the heap, which keeps up to ``trim`` bytes freed at its top
    and grows by ``top_pad`` bytes more than asked; after: the parameters as they were before, and the heap's free
    pages handed back (:func:`release_freed_memory`). glibc only; a no-op elsewhere.

    For work that allocates and frees the same large arrays over and over, as a conversion does: by default glibc
    maps each block above its threshold (at most 32 MiB) on its own and unmaps it when freed, and trims the heap's
    free top, so the next array is faulted in page by page again; that took a third of a conversion's CPU."""
    before = {option: _MALLOC_OPTIONS.get(option, default) for option, default in _GLIBC_DEFAULTS.items()}
    try:
        for option, value in {M_MMAP_THRESHOLD: largest_block, M_TRIM_THRESHOLD: trim, M_TOP_PAD: top_pad}.items():
            set_malloc_option(option, value)
        yield
    finally:
        for option, value in before.items():
            set_malloc_option(option, value)
        release_freed_memory()


def _glibc(name: str):
    """A glibc function of this process, or None (another platform or C library)."""
    if name not in _GLIBC:
        try:
            _GLIBC[name] = getattr(ctypes.CDLL(None), name) if sys.platform.startswith("linux") else None
        except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            _GLIBC[name] = None
    return _GLIBC[name]


_GLIBC: dict[str, object] = {}


def default_providers() -> list[str]:
    """CUDA when this onnxruntime has it (onnxruntime-gpu) and WHISPERANE_DEVICE is not 'cpu'."""
    if os.environ.get("WHISPERANE_DEVICE", "").lower() == "cpu":
        return ["CPUExecutionProvider"]
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def uses_cpu_only() -> bool:
    """Whether ONNX components would run on the CPU provider alone."""
    available = set(_ort().get_available_providers())
    return [p for p in default_providers() if p in available] in ([], ["CPUExecutionProvider"])


def _move_into_place(work: Path, target: Path) -> None:
    """Rename a finished cache directory to ``target``; drop it if another process got there first or the
    session never wrote its graph."""
    try:
        if (work / CACHED_GRAPH).is_file() and not target.exists():
            os.rename(work, target)
    except OSError:  # lost a race: the other copy is the same
        pass
    shutil.rmtree(work, ignore_errors=True)


def _drop_stale_caches(current: Path) -> None:
    """Remove the ORT-format graphs that earlier versions of this cache wrote for the component (this version
    never reads them; each is as large as the component). Caches for other keys stay: a models directory
    shared by machines with other CPUs or ONNX Runtime versions keeps one for each."""
    stem, _, _ = current.name.rpartition(".")
    stale = re.compile(rf"{re.escape(stem)}\.[0-9a-f]{{16}}\.ort")
    for entry in current.parent.iterdir():
        if stale.fullmatch(entry.name) and entry.is_file():
            entry.unlink(missing_ok=True)
