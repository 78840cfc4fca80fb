"""ONNX Runtime sessions from the saved optimized graph (executors.OnnxComponent's cache): the same outputs as
the component itself, and a damaged cache rebuilt rather than trusted."""

from __future__ import annotations

import ctypes
import json
import mmap
import platform
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from whisperane.runtime.executors import (
    CACHED_GRAPH,
    CACHED_WEIGHTS,
    MappedWeights,
    OnnxComponent,
    file_mappings,
    file_pages_only,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def encoder_copy(tiny_en_bundle, tmp_path):
    """The tiny.en int8 encoder (prepacked int8 MatMuls, ONNX Runtime's MultiHeadAttention) in a fresh folder."""
    path = tmp_path / "AudioEncoder.int8.onnx"
    shutil.copy(tiny_en_bundle / path.name, path)
    return path


def _mel_feeds(component: OnnxComponent) -> dict[str, np.ndarray]:
    """A random one-window input for the encoder component."""
    name, shape = next(iter(component.inputs.items()))
    return {name: np.random.default_rng(0).standard_normal((1, *shape[1:])).astype(np.float32)}


def _outputs(path) -> dict[str, np.ndarray]:
    component = OnnxComponent(path, threads=2)
    return component.run(_mel_feeds(component))


def test_cached_graph_gives_the_components_outputs(encoder_copy):
    built = _outputs(encoder_copy)  # optimizes the component and saves the graph and prepacked weights
    (cache,) = (encoder_copy.parent / ".ort-cache").iterdir()
    assert sorted(p.name for p in cache.iterdir()) == sorted([CACHED_GRAPH, CACHED_WEIGHTS])
    stale = cache.parent / f"{encoder_copy.stem}.{'0' * 16}.ort"  # an earlier version's ORT-format cache
    stale.write_bytes(b"old")
    cached = _outputs(encoder_copy)
    assert built.keys() == cached.keys()
    for name, value in built.items():
        np.testing.assert_array_equal(cached[name], value)
    assert stale.exists()  # only a rebuild cleans up

    weights = cache / CACHED_WEIGHTS
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])  # truncated: refused by ONNX Runtime, rebuilt
    rebuilt = _outputs(encoder_copy)
    for name, value in built.items():
        np.testing.assert_array_equal(rebuilt[name], value)
    assert weights.stat().st_size == size
    assert not stale.exists()


def test_outputs_written_in_place_are_the_runs_outputs(encoder_copy):
    """run_into binds the caller's arrays as the outputs (batched mode's encoder writes into its batch's rows)."""
    component = OnnxComponent(encoder_copy, threads=2)
    feeds = _mel_feeds(component)
    expected = component.run(feeds)
    wanted = [n for n in expected if n.startswith("encoder_attn_")]
    rows = {n: np.zeros((3, *expected[n].shape[1:]), np.float32) for n in wanted}
    component.run_into(feeds, {n: rows[n][1:2] for n in wanted})
    for n in wanted:
        np.testing.assert_array_equal(rows[n][1:2], expected[n])
        assert not rows[n][0].any() and not rows[n][2].any()  # only the row bound was written
    shape = expected[wanted[0]].shape
    strided = np.zeros((*shape[:-1], 2 * shape[-1]), np.float32)[..., ::2]  # every other float: not contiguous
    with pytest.raises(ValueError, match="C-contiguous"):
        component.run_into(feeds, {wanted[0]: strided})


def _resident_kib(files) -> int:
    """Resident KiB of this process's mappings of ``files`` (by inode), from /proc/self/smaps."""
    inodes, total, ours = {f.stat().st_ino for f in files}, 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header: range perms offset dev inode [path]
                ours = int(fields[4]) in inodes
            elif ours and fields[0] == "Rss:":
                total += int(fields[1])
    return total


# A transcription in a fresh interpreter, as the command line runs it (one model in the process), loaded with the
# idle weights released (the default) or kept: the peak resident set (VmHWM) and the words.
PEAK = """
import json, sys
from whisperane import load_model
from whisperane.runtime.sessions import keep_resident
from whisperane.transcribe import transcribe

bundle, audio, release = sys.argv[1], sys.argv[2], sys.argv[3] == "release"
model = load_model(bundle, threads=2, compute_type="int8", wrap=None if release else keep_resident)
result = transcribe(audio, model)
status = open("/proc/self/status").read()
print(json.dumps({"peak_kib": int(status.split("VmHWM:")[1].split()[0]), "json": result.to_dict()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="weights are released through /proc/self/pagemap "
                    "and madvise, which only Linux has; elsewhere release_weights is a no-op")
def test_releasing_idle_weights_lowers_the_peak_and_changes_nothing(tiny_en_bundle):
    """JFK with tiny.en: the encoder's weights (20 MiB mapped) leave the resident set before the decoder runs,
    the decoder's (65 MiB) while the encoder runs; the peak is that of one component's weights, not both, and the
    result is the same to the last digit. The peak drops by most of the encoder's weights: 22 MB on an Intel Xeon
    without VNNI (191 -> 169 MB), 14.0-17.5 MiB in 8 pairs on a Xeon with AMX (184-190 -> 168-173 MiB, +-3 MiB
    within each mode), where a fixed 15 MiB floor failed 3 runs of 5; the floor is 60 % of the weights."""
    from whisperane import load_model

    load_model(tiny_en_bundle, compute_type="int8")  # the saved optimized graphs exist from here on
    audio = tiny_en_bundle.parents[1] / "examples" / "jfk.flac"
    runs = {}
    for mode in ("release", "keep"):
        run = subprocess.run([sys.executable, "-c", PEAK, str(tiny_en_bundle), str(audio), mode],
                             capture_output=True, text=True, check=True)
        runs[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    assert runs["release"]["json"] == runs["keep"]["json"]
    encoder_weights = next(tiny_en_bundle.glob(".ort-cache/AudioEncoder.int8.*/weights.data")).stat().st_size
    assert (runs["keep"]["peak_kib"] - runs["release"]["peak_kib"]) * 1024 > 0.6 * encoder_weights


def _present_pages(start: int, length: int) -> int:
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // mmap.PAGESIZE * 8)
        entries = np.frombuffer(pagemap.read(length // mmap.PAGESIZE * 8), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="weights are released through /proc/self/pagemap "
                    "and madvise, which only Linux has; elsewhere release_weights is a no-op")
def test_a_mapping_with_a_page_written_to_is_never_released(tmp_path):
    """Both mappings are private and copy-on-write, as ONNX Runtime maps weights; one page of the second is
    written to. Dropping that mapping's pages would lose the write, so only the first is released."""
    path = tmp_path / "weights.data"
    content = bytes(range(256)) * (4096 * 4)  # 4 MiB
    path.write_bytes(content)
    with open(path, "rb") as f:
        kept, written = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) for _ in range(2))
    address = {m: ctypes.addressof(ctypes.c_char.from_buffer(m)) for m in (kept, written)}
    assert kept[::4096] == written[::4096] == content[::4096]  # every page read: resident
    written[5000] = 7
    kept_range = (address[kept], address[kept] + len(content))
    assert sorted(file_mappings(path)) == sorted([kept_range, (address[written], address[written] + len(content))])
    assert file_pages_only(file_mappings(path)) == [kept_range]
    assert _present_pages(address[kept], len(content)) == len(content) // mmap.PAGESIZE
    MappedWeights(file_mappings(path)).release()
    assert _present_pages(address[kept], len(content)) == 0
    assert written[5000] == 7 and kept[:] == content  # the write kept; the released pages read back from the file


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="weights are released through /proc/self/maps "
                    "and madvise, which only Linux has; elsewhere release_weights is a no-op")
def test_each_session_releases_only_the_mappings_it_made(encoder_copy):
    """Two sessions of one weights file (two models loaded from a bundle) map it twice. Each releases its own
    mappings only: the other's are unmapped when that session is freed, and their addresses reused (a release
    of them then zeroed live memory of the process: a test run aborted in glibc's allocator)."""
    OnnxComponent(encoder_copy, threads=2)  # saves the optimized graph and its weights file
    (weights,) = (encoder_copy.parent / ".ort-cache").glob(f"*/{CACHED_WEIGHTS}")
    first, second = OnnxComponent(encoder_copy, threads=2), OnnxComponent(encoder_copy, threads=2)
    mine, theirs = set(second.mapped_weights.ranges), set(first.mapped_weights.ranges)
    assert mine and theirs and not mine & theirs
    assert mine | theirs <= set(file_mappings(weights))
    del first
    assert not theirs & set(file_mappings(weights))  # unmapped with its session
    name, shape = next(iter(second.inputs.items()))
    mel = {name: np.random.default_rng(0).standard_normal((1, *shape[1:])).astype(np.float32)}
    before = second.run(mel)
    second.release_weights()
    assert _resident_kib([weights]) == 0
    for key, value in second.run(mel).items():
        np.testing.assert_array_equal(value, before[key])


def test_only_the_one_token_decoders_threads_spin_between_calls(tiny_en_bundle):
    """The one-token steps follow one another, so their session's threads wait spinning; every other component's
    next call is far off, and their spinning slowed the component that runs next (runtime.sessions.SPINNING_ROLES)."""
    from whisperane import load_model

    def spins(component) -> str:
        return component.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")

    from whisperane.runtime.sessions import keep_resident

    def opened(compute_type: str) -> tuple[dict, dict]:
        """(the kind's files, the components the model runs by role), recorded through ``load_model``'s ``wrap``:
        every one of them, the prefill table's opened on first use, the multi-token decoder's in the background."""
        components = {}

        def record(role, component, reopen):
            components[role] = keep_resident(role, component, reopen)
            return components[role]

        model = load_model(tiny_en_bundle, threads=2, compute_type=compute_type, wrap=record)
        model.prefill_table(0, 0)
        roles = {"mel", "encoder", "decoder", "prefill", "sequence"} & model.kind.files.keys()
        deadline = time.monotonic() + 60
        while not roles <= components.keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert components.keys() == roles
        return model.kind.files, components

    int8_files, int8 = opened("int8")
    assert "sequence" not in int8_files  # the int8 kind's one decoder session takes every decoder call
    float32_files, float32 = opened("float32")
    for components in (int8, float32):
        assert spins(components["decoder"]) == "1"
        assert (spins(components["encoder"]), spins(components["mel"]), spins(components["prefill"])) == ("0", "0", "0")
    assert spins(float32["sequence"]) == "0"  # prompts and alignment passes, one call each


# Run in a fresh interpreter: glibc's mmap threshold only decides when the heap has no free chunk large enough, and
# the earlier tests of this process may have left one (the block is then reused without a fault, whatever is set).
_FAULTS_OF_REUSING = """
import ctypes, json, resource, sys
from whisperane.runtime.executors import heap_keeps_large_blocks

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
size = int(sys.argv[1])


def faults_of_reusing():
    for _ in range(2):  # the second time round: the first may fault a heap's new pages in
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


outside = faults_of_reusing()
with heap_keeps_large_blocks():
    inside = faults_of_reusing()
print(json.dumps([outside, inside, faults_of_reusing()]))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt; elsewhere heap_keeps_large_blocks "
                    "is a no-op")
def test_the_heap_keeps_large_blocks_only_inside_the_block():
    """A 64 MiB block, above any threshold glibc sets itself, is mapped on its own and faulted in page by page at
    each use; inside heap_keeps_large_blocks (the converter's build) the heap keeps it once freed; after, glibc
    maps it on its own again. Minor page faults of the block's second use, in a fresh process."""
    size = 64 << 20
    pages = size // mmap.PAGESIZE
    run = subprocess.run([sys.executable, "-c", _FAULTS_OF_REUSING, str(size)], capture_output=True, text=True,
                         timeout=120, check=True)
    before, inside, after = json.loads(run.stdout)
    assert before >= pages // 2
    assert inside < pages // 10
    assert after >= pages // 2
