"""``whisperane batch`` on a local Ray (2 CPUs, 2 workers, tiny.en): one row per file, rows identical to
transcribe()'s results, manifests' columns kept, resumption after a kill, the Parquet schema.

Ray starts once for the module; the kill test's driver runs in a subprocess that joins it through RAY_ADDRESS
(as a user's run on a cluster does; starting a second local Ray there cost CI time for nothing the test checks).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from conftest import CORPUS_DIR, DATA_DIR, REPO_ROOT

import whisperane
from whisperane.errors import WhisperaneError
from whisperane.ray_batch import command, dataset
from whisperane.ray_batch.shards import RESULT_SCHEMA, OutputDir, file_sha256, plan, read_shard

# Short English clips, each in both the shared corpus and tests/data (the corpus copy when it is there).
CLIP_FILES = ["jfk.flac", "1089-134686-0001.flac", "1089-134691-0000.flac", "1089-134691-0001.flac",
              "LJ001-0002.flac", "LJ001-0008.flac"]


def _clip_paths() -> list[Path]:
    manifest = CORPUS_DIR / "manifest.jsonl"
    if manifest.is_file():
        entries = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
        by_name = {Path(e["audio"]).name: CORPUS_DIR / e["audio"] for e in entries}
        if all(name in by_name and by_name[name].is_file() for name in CLIP_FILES):
            return [by_name[name] for name in CLIP_FILES]
    return [DATA_DIR / name for name in CLIP_FILES]


@pytest.fixture(scope="module")
def local_ray() -> str:
    """The module's local Ray (2 CPUs); its address, for drivers in other processes."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def audio_dir(tmp_path_factory) -> Path:
    """The clips (one in a subdirectory) plus two bad files: text named .wav and a truncated FLAC."""
    root = tmp_path_factory.mktemp("audio").resolve()
    (root / "sub").mkdir()
    for i, clip in enumerate(_clip_paths()):
        shutil.copy(clip, root / ("sub" if i == 1 else ".") / clip.name)
    (root / "notes.wav").write_text("not audio\n")
    (root / "cut.flac").write_bytes((DATA_DIR / "LJ001-0008.flac").read_bytes()[:3000])
    return root


@pytest.fixture(scope="module")
def reference(tiny_en_bundle, audio_dir) -> dict[str, dict]:
    """transcribe()'s JSON for each good file, with the workers' thread count."""
    model = whisperane.load_model(tiny_en_bundle, threads=1)
    return {str(p): whisperane.transcribe(str(p), model=model).to_dict()
            for p in sorted(audio_dir.rglob("*.flac")) if p.name != "cut.flac"}


def _batch(*argv) -> tuple[int, list[str]]:
    """``whisperane batch *argv`` in this process: (exit status, stderr lines)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = command.main([str(a) for a in argv])
    return code, err.getvalue().splitlines()


def _rows(out: Path) -> list[dict]:
    rows = [row for shard in sorted(out.glob("part-*")) for row in read_shard(shard)]
    assert len({r["path"] for r in rows}) == len(rows), "a file has two rows"
    return rows


def _workers_of_this_process() -> list[int]:
    """The pids of the Ray actors (``ray::MapWorker...``) this test process's local Ray runs."""
    parents, names = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            names[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        parents[int(stat.parent.name)] = int(fields[1])

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [pid for pid, cmd in names.items() if cmd.startswith(b"ray::MapWorker") and descends(pid)]


@pytest.fixture(scope="module")
def directory_run(local_ray, tiny_en_bundle, audio_dir, tmp_path_factory):
    """The directory run; one of its two actors is killed (SIGKILL) once the first shard is written."""
    out = tmp_path_factory.mktemp("batch") / "out"
    killed: list[tuple[int, int]] = []  # (pid, shards written when it was killed)

    def kill_a_worker():
        deadline = time.monotonic() + 600
        while not killed and time.monotonic() < deadline:
            shards, workers = len(list(out.glob("part-*"))), _workers_of_this_process()
            if shards and workers:
                os.kill(workers[0], signal.SIGKILL)
                killed.append((workers[0], shards))
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_a_worker, daemon=True)
    watcher.start()
    code, err = _batch(audio_dir, "--output", out, "--model", tiny_en_bundle, "--workers", 2, "--shard-size", 3)
    killed.append((0, 0))  # stops the watcher when the run ended first
    watcher.join()
    return code, err, out, killed[0]


@pytest.mark.slow
def test_directory_gives_one_row_per_file(directory_run, audio_dir, reference):
    code, err, out, _ = directory_run
    rows = {r["path"]: r for r in _rows(out)}
    files = {str(p.resolve()) for p in audio_dir.rglob("*") if p.is_file()}
    assert set(rows) == files and len(files) == len(CLIP_FILES) + 2
    for path, expected in reference.items():
        row = rows[path]
        assert row["error"] is None
        assert {k: row[k] for k in expected} == expected  # text, language, duration, segments with words
        assert row["text"] == expected["text"] and expected["text"].strip()
    for name in ("notes.wav", "cut.flac"):
        row = rows[str(audio_dir / name)]
        assert row["text"] is None and row["segments"] is None
        assert row["error"].startswith(f"{audio_dir / name}: not a valid") and "\n" not in row["error"]
    assert code == 1
    assert f"whisperane: error: 2 of {len(files)} file(s) failed; their rows in {out} hold the errors" in err
    assert sum(line.startswith("whisperane: error: ") for line in err) == 3  # the two files, then the count
    assert any(line.startswith(f"whisperane: {len(files)}/{len(files)} files, ") and "RTF" in line for line in err)


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_its_files_redone(directory_run):
    # Its rows are checked with the others in test_directory_gives_one_row_per_file.
    _, _, _, (pid, shards_then) = directory_run
    assert pid > 0 and 1 <= shards_then < 3, "no worker was killed while the run had files to do"


@pytest.mark.slow
def test_rerun_skips_rows_and_retries_errors_on_request(directory_run, audio_dir, tiny_en_bundle, tmp_path):
    _, _, first, _ = directory_run
    out = tmp_path / "out"
    shutil.copytree(first, out)
    before = {p.name: p.read_bytes() for p in out.glob("part-*")}
    args = (audio_dir, "--output", out, "--model", tiny_en_bundle, "--workers", 2, "--shard-size", 3)
    code, err = _batch(*args)
    assert code == 1 and {p.name: p.read_bytes() for p in out.glob("part-*")} == before
    assert any("8 of 8 file(s) already have rows" in line and "(2 with errors" in line for line in err)
    code, err = _batch(*args, "--retry-errors")
    rows = _rows(out)
    assert code == 1 and len(rows) == len(CLIP_FILES) + 2
    retried = [json.loads(line) for p in set(out.glob("part-*")) - {out / n for n in before} for line in p.open()]
    assert sorted(r["path"] for r in retried) == sorted(str(audio_dir / n) for n in ("cut.flac", "notes.wav"))
    assert all(r["error"] for r in retried)


def _write_manifest(kind: str, path: Path, rows: list[dict]) -> None:
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_manifest_keeps_its_columns(kind, local_ray, tiny_en_bundle, audio_dir, reference, tmp_path):
    tmp_path = tmp_path.resolve()  # the manifest's relative paths are resolved from its real directory
    listed = [
        {"path": os.path.relpath(audio_dir / "LJ001-0008.flac", tmp_path), "id": "lj8", "speaker": 7,
         "text": "has never been surpassed."},
        {"path": str(audio_dir / "notes.wav"), "id": "bad", "speaker": 9, "text": "none"},
    ]
    if kind == "csv":
        listed = [{k: str(v) for k, v in row.items()} for row in listed]  # CSV values are text
    manifest = tmp_path / f"manifest.{kind}"
    _write_manifest(kind, manifest, listed)
    out = tmp_path / "out"
    fmt = "parquet" if kind == "parquet" else "jsonl"
    code, err = _batch(manifest, "--output", out, "--model", tiny_en_bundle, "--workers", 1, "--format", fmt)
    assert code == 1, err
    rows = sorted(_rows(out), key=lambda r: r["id"])
    assert [(r["id"], r["speaker"], r["input_text"]) for r in rows] == sorted(
        (r["id"], r["speaker"], r["text"]) for r in listed
    )
    good, bad = rows[1], rows[0]
    assert good["path"] == str(audio_dir / "LJ001-0008.flac") and good["text"] == reference[good["path"]]["text"]
    assert bad["text"] is None and bad["error"].startswith(str(audio_dir / "notes.wav"))
    if kind == "parquet":  # the whole directory reads back as one table with the documented schema
        table = pq.read_table(out)
        input_schema = pa.Table.from_pylist(listed).rename_columns(["path", "id", "speaker", "input_text"]).schema
        assert table.schema.remove_metadata() == pa.schema([*input_schema, *RESULT_SCHEMA])
        assert table.num_rows == 2


@pytest.mark.slow
def test_killed_run_resumes_without_redoing_shards(directory_run, local_ray, audio_dir, tiny_en_bundle, tmp_path):
    _, _, complete, _ = directory_run
    out = tmp_path / "out"
    args = [audio_dir, "--output", out, "--model", tiny_en_bundle, "--workers", 2, "--shard-size", 1]
    proc = subprocess.Popen([sys.executable, "-m", "whisperane.ray_batch", *map(str, args)], cwd=REPO_ROOT,
                            env={**os.environ, "RAY_ADDRESS": local_ray}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(list(out.glob("part-*"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver (it writes the shards); Ray then ends its job's actors
        proc.wait()
    first = {p: p.read_bytes() for p in out.glob("part-*")}
    assert 2 <= len(first) < len(CLIP_FILES) + 2, "the run was not killed midway"
    (out / ".part-0-00009.jsonl.1234.0badf00d.tmp").write_text('{"path": "half a row')  # as a kill during a write leaves
    code, err = _batch(*args)
    assert code == 1 and f"whisperane: error: 2 of {len(CLIP_FILES) + 2} file(s) failed; their rows in {out} hold the errors" in err
    assert {p: p.read_bytes() for p in first} == first  # shards of the killed run untouched
    assert not list(out.glob(".*.tmp"))
    rows = _rows(out)
    redone = [r["path"] for p in set(out.glob("part-*")) - set(first) for r in read_shard(p)]
    done_before = [r["path"] for p in first for r in read_shard(p)]
    assert sorted(redone + done_before) == sorted(r["path"] for r in rows) and not set(redone) & set(done_before)
    assert sorted(rows, key=lambda r: r["path"]) == sorted(_rows(complete), key=lambda r: r["path"])


@pytest.mark.slow
def test_transcribe_dataset_returns_a_ray_dataset(local_ray, tiny_en_bundle, audio_dir, reference):
    path = str(audio_dir / "LJ001-0002.flac")
    rows = dataset.transcribe_dataset([path], tiny_en_bundle, workers=1).take_all()
    assert [(r["path"], r["text"], r["error"]) for r in rows] == [(path, reference[path]["text"], None)]


@pytest.mark.slow
def test_a_long_files_row_is_the_clis_result(tiny_en_bundle, tmp_path):
    """Over 30 s, each window's log-mel is floored from the file's peak (the quiet start here is read against
    the loud end), as `whisperane transcribe` does; the row reads back as transcribe()'s result (from_dict)."""
    import dataclasses

    import numpy as np
    import soundfile as sf

    from whisperane.audio import load_audio
    from whisperane.result import TranscriptionResult

    jfk, hour = load_audio(str(DATA_DIR / "jfk.flac")), load_audio(str(DATA_DIR / "1089-134691-0001.flac"))
    path = tmp_path / "quiet_then_loud.wav"
    pause = np.zeros(8 * 16000, np.float32)
    sf.write(str(path), np.concatenate([jfk * 0.02, pause, hour * 0.02, pause, jfk, hour]), 16000, subtype="PCM_16")
    actor = dataset.Transcriber(str(tiny_en_bundle), "tiny.en", 1, "default",
                                dataclasses.asdict(whisperane.TranscribeOptions()))
    row = actor.transcribe_file(str(path))
    assert TranscriptionResult.from_dict(row) == whisperane.transcribe(str(path), model=actor.model)


def test_bad_invocations_fail_in_one_line(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"file": "a.wav"}\n')
    cases = [
        ((tmp_path / "missing", "-o", tmp_path / "o"), 1, "no such file or directory"),
        ((manifest, "-o", tmp_path / "o"), 1, "the manifest has no 'path' column (columns: file)"),
        ((tmp_path, "-o", tmp_path / "o", "--workers", "0"), 2, "--workers must be >= 1"),
    ]
    for argv, status, message in cases:
        code, err = _batch(*argv)
        assert (code, len(err)) == (status, 1) and message in err[0] and err[0].startswith("whisperane: error: ")


def test_rows_stand_while_the_file_is_unchanged(tmp_path):
    a, b, c = (str(tmp_path / name) for name in ("a.wav", "b.wav", "c.wav"))
    for path in (a, b, c):
        Path(path).write_bytes(path.encode())
    out = OutputDir.open(tmp_path / "out", "jsonl", {"model": "m"})
    out.write(pa.Table.from_pylist([{"path": a, "sha256": file_sha256(a), "error": None},
                                    {"path": b, "sha256": file_sha256(b), "error": None},
                                    {"path": c, "sha256": file_sha256(c), "error": f"{c}: bad"}]))
    Path(b).write_bytes(b"new content")
    again = OutputDir.open(tmp_path / "out", "jsonl", {"model": "m"})
    assert plan(again, [a, b, c], retry_errors=False) == ([b], [a, c])
    assert [r["path"] for r in _rows(tmp_path / "out")] == [a, c]  # the changed file's row is gone
    assert plan(again, [a, b, c], retry_errors=True) == ([b, c], [a])
    assert [r["path"] for r in _rows(tmp_path / "out")] == [a]
    with pytest.raises(WhisperaneError, match="holds results made with another model; re-run with the same"):
        OutputDir.open(tmp_path / "out", "jsonl", {"model": "other"})
