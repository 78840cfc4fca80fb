"""``whisperane batch``: transcribe a corpus on Ray Data, on one machine or a Ray cluster, resumably.

The driver lists the inputs (``batch_inputs``), resolves the model to a bundle once (converting it on first
use) and drops the files whose rows already stand in the output directory (``batch_shards``). Ray Data then
streams the paths through an actor pool: each actor loads one model with ``threads_per_worker`` threads and
reads, decodes and transcribes its files itself. A failed file is a row with its one-line error; an actor
that dies is restarted by Ray and its block retried (Ray Data's default for actor pools). The driver writes
the rows as they arrive into shards of ``--shard-size`` rows, each atomically.

``pip install 'whisperane[ray]'`` provides Ray; the rest of whisperane does not need it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .batch_inputs import read_inputs, rename_clashes
from .batch_shards import FORMATS, RESULT_COLUMNS, RESULT_SCHEMA, OutputDir, file_sha256, plan
from .errors import WhisperaneError

if TYPE_CHECKING:
    import ray.data

PROGRESS_INTERVAL_S = 10.0  # seconds between progress lines on stderr


class _Transcriber:
    """One Ray actor: one model, loaded when the first readable file needs it (bad files fail fast)."""

    def __init__(self, bundle: str, model_name: str, threads: int, compute_type: str, options: dict):
        self.bundle, self.threads, self.compute_type, self.options = bundle, threads, compute_type, options
        self.model_name = model_name
        self.options_json = json.dumps({"compute_type": compute_type, **options}, sort_keys=True)
        self.model = None

    def __call__(self, batch: pa.Table) -> pa.Table:
        records = [self.transcribe_file(path) for path in batch.column("path").to_pylist()]
        results = pa.Table.from_pylist(records, schema=RESULT_SCHEMA)
        for name in RESULT_COLUMNS:
            batch = batch.append_column(RESULT_SCHEMA.field(name), results.column(name))
        return batch

    def transcribe_file(self, path: str) -> dict:
        import whisperane
        from whisperane.audio import open_audio

        row: dict[str, Any] = {"model": self.model_name, "options": self.options_json}
        try:
            row["sha256"] = file_sha256(path)
            stream = open_audio(path)
            try:
                result = whisperane.transcribe(stream, model=self._model(), **self.options)
            finally:
                stream.close()
            return {**row, **result.to_dict()}
        except _ModelUnavailable:
            raise  # no file can be transcribed: the run stops with this error
        except WhisperaneError as e:
            return {**row, "error": str(e)}
        except OSError as e:
            return {**row, "error": f"{path}: {_describe(e)}"}
        except Exception as e:  # noqa: BLE001 - one bad file must not end the run
            return {**row, "error": f"{path}: internal error ({_describe(e)})"}

    def _model(self):
        if self.model is None:
            import whisperane

            try:
                self.model = whisperane.load_model(self.bundle, threads=self.threads, compute_type=self.compute_type)
            except WhisperaneError as e:
                raise _ModelUnavailable(f"on node {os.uname().nodename}: {e}") from None
        return self.model


class _ModelUnavailable(WhisperaneError):
    """An actor could not load the model (a bundle missing on a node): the run stops."""


def _describe(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def transcribe_dataset(
    data: ray.data.Dataset | Sequence[str | os.PathLike],
    model: str | os.PathLike = "tiny.en",
    *,
    workers: int = 1,
    threads_per_worker: int = 1,
    compute_type: str = "default",
    files_per_block: int = 1,
    model_label: str | None = None,
    **options: Any,
) -> ray.data.Dataset:
    """A Ray Dataset of transcription rows: the input's columns (those named like a result column renamed
    ``input_<name>``) plus ``text``, ``language``, ``duration``, ``language_probs``, ``segments``,
    ``error``, ``sha256``, ``model`` and ``options`` (see ``batch_shards.RESULT_SCHEMA``).

    ``data``: a Dataset with a ``path`` column (files readable on every node), or a list of paths.
    ``model`` is resolved to a bundle here, once (converted on first use); the actors load that bundle, so on
    a cluster it must sit at the same path on every node (a shared filesystem). ``options`` are
    ``TranscribeOptions`` fields. Lazy, like any Dataset: iterate, write or materialize it.
    """
    import ray.data

    from .bundle import resolve_bundle
    from .options import TranscribeOptions

    option_kwargs = dataclasses.asdict(TranscribeOptions(**options))  # bad options fail here, in the driver, once
    bundle = resolve_bundle(model)
    if not isinstance(data, ray.data.Dataset):
        paths = [os.path.abspath(p) for p in data]
        data = ray.data.from_arrow([pa.table({"path": pa.array(paths[i : i + files_per_block], pa.string())})
                                    for i in range(0, len(paths), files_per_block)])  # fmt: skip
    renames = rename_clashes(data.columns(), RESULT_COLUMNS)
    if renames:
        data = data.rename_columns(renames)
    return data.map_batches(
        _Transcriber,
        fn_constructor_kwargs={"bundle": str(bundle), "model_name": model_label or str(model), "threads": threads_per_worker,
                               "compute_type": compute_type, "options": option_kwargs},  # fmt: skip
        batch_format="pyarrow",
        batch_size=1,  # a block's files one at a time; blocks are what actors share out
        compute=ray.data.ActorPoolStrategy(size=workers),
        num_cpus=threads_per_worker,
    )


# --- the command line ----------------------------------------------------------------------------------------


def add_batch_parser(subparsers) -> None:
    """The ``batch`` subcommand and its arguments (the transcription options are ``transcribe``'s)."""
    p = subparsers.add_parser(
        "batch", help="transcribe a directory, glob or manifest of files on Ray Data into resumable shards",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    p.add_argument("input", help="a directory (searched recursively), a glob, or a manifest "
                                 "(.jsonl, .csv, .parquet with a 'path' column; other columns are kept)")  # fmt: skip
    p.add_argument("--output", "-o", required=True, help="directory of output shards (re-runs resume in it)")
    p.add_argument("--model", default="tiny.en", help="model name (converted once, before the workers start) or bundle directory")
    p.add_argument("--workers", type=int, default=None, help="actors, one model each (default: the cluster's CPUs / threads per worker)")
    p.add_argument("--threads-per-worker", type=int, default=1, help="CPU threads (and Ray CPUs) per worker")
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: $RAY_ADDRESS, else a local Ray for the run)")
    p.add_argument("--format", default="jsonl", choices=sorted(FORMATS), help="shard format")
    p.add_argument("--shard-size", type=int, default=100, help="rows per shard: the unit of resumption")
    p.add_argument("--retry-errors", action="store_true", help="transcribe again the files whose rows hold an error")
    p.add_argument("--compute-type", default="default", choices=["default", "int8", "float32"])
    _add_transcription_options(p)


def _add_transcription_options(parser: argparse.ArgumentParser) -> None:
    from .options import add_option_arguments

    add_option_arguments(parser)


def _transcription_options(args: argparse.Namespace) -> dict:
    """The TranscribeOptions fields the flags give, as keyword arguments of transcribe()."""
    from .options import options_from_args

    return dataclasses.asdict(options_from_args(args))


def _error(msg: str) -> None:
    print(f"whisperane: error: {msg}", file=sys.stderr, flush=True)


def _note(msg: str) -> None:
    print(f"whisperane: {msg}", file=sys.stderr, flush=True)


def run_batch(args: argparse.Namespace) -> int:
    """``whisperane batch``: 0 when every file has a good row, 1 when any failed (their count on stderr) or
    the run could not start, 2 for a bad argument, 130 when interrupted (the shards written stay)."""
    for name, value in (("--workers", args.workers), ("--threads-per-worker", args.threads_per_worker),
                        ("--shard-size", args.shard_size)):  # fmt: skip
        if value is not None and value < 1:
            _error(f"{name} must be >= 1")
            return 2
    try:
        import ray  # noqa: F401
    except ImportError:
        _error("whisperane batch needs Ray: pip install 'whisperane[ray]'")
        return 1
    root = Path(args.output)
    try:
        inputs = read_inputs(args.input)
        options = _transcription_options(args)
        root.mkdir(parents=True, exist_ok=True)
    except (WhisperaneError, TypeError, ValueError) as e:
        _error(str(e))
        return 1
    except OSError as e:
        _error(f"{args.output}: cannot create the output directory ({_describe(e)})")
        return 1
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(root / ".lock"), timeout=0):
            return _run_locked(args, inputs, root, options)
    except Timeout:
        _error(f"{args.output}: another whisperane batch is writing to this directory")
        return 1


def _run_locked(args: argparse.Namespace, inputs: pa.Table, root: Path, options: dict) -> int:
    from .bundle import resolve_bundle

    settings = {"model": str(args.model), "options": {"compute_type": args.compute_type, **options}}
    try:
        out = OutputDir.open(root, args.format, json.loads(json.dumps(settings)))
        renames = rename_clashes(inputs.column_names, RESULT_COLUMNS)
        inputs = inputs.rename_columns([renames.get(n, n) for n in inputs.column_names])
        paths = inputs.column("path").to_pylist()
        todo, done = plan(out, paths, args.retry_errors)
    except (WhisperaneError, OSError, ValueError) as e:
        _error(f"{args.output}: {e}" if isinstance(e, OSError) else str(e))
        return 1
    earlier = [out.rows[p].error for p in done if out.rows[p].error is not None]
    if done:
        _note(f"{len(done)} of {len(paths)} file(s) already have rows in {args.output}, skipped"
              + (f" ({len(earlier)} with errors; --retry-errors retries them)" if earlier else ""))  # fmt: skip
    failed = 0
    if todo:
        import pyarrow.compute as pc

        try:
            bundle = resolve_bundle(args.model)  # converted here, once, before any worker starts
            todo_rows = inputs.filter(pc.is_in(inputs["path"], pa.array(todo, pa.string())))
            failed = _transcribe_todo(args, todo_rows, out, bundle, options)
        except WhisperaneError as e:
            _error(str(e))
            return 1
    if failed or earlier:
        _error(f"{failed + len(earlier)} of {len(paths)} file(s) failed; their rows in {args.output} hold the errors")
        return 1
    return 0


def _transcribe_todo(args: argparse.Namespace, todo: pa.Table, out: OutputDir, bundle: Path, options: dict) -> int:
    """Transcribe the rows of ``todo`` on Ray and write them to ``out``; the number that failed."""
    import ray

    started = _start_ray(args.ray_address)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        workers = args.workers or max(1, cpus // args.threads_per_worker)
        if workers * args.threads_per_worker > cpus:
            message = (f"{workers} worker(s) x {args.threads_per_worker} thread(s) need "
                       f"{workers * args.threads_per_worker} CPUs; the Ray cluster has {cpus}")  # fmt: skip
            if started:
                raise WhisperaneError(message)  # a local Ray does not grow: the pool would wait forever
            _note(f"{message} now (waiting for the cluster to scale up)")
        per_block = max(1, min(args.shard_size, 16, todo.num_rows // (workers * 4)))
        blocks = [todo.slice(i, per_block) for i in range(0, todo.num_rows, per_block)]
        dataset = transcribe_dataset(
            ray.data.from_arrow(blocks), bundle, workers=workers, threads_per_worker=args.threads_per_worker,
            compute_type=args.compute_type, model_label=str(args.model), **options,
        )  # fmt: skip
        _note(f"transcribing {todo.num_rows} file(s) with {workers} worker(s) x {args.threads_per_worker} thread(s)")
        try:
            return _write_rows(dataset, out, args.shard_size, todo.num_rows)
        except Exception as e:
            cause = _whisperane_cause(e)
            if cause is None:
                raise
            raise WhisperaneError(str(cause)) from None
    finally:
        if started:
            ray.shutdown()


def _whisperane_cause(e: BaseException | None) -> WhisperaneError | None:
    """The WhisperaneError inside the exceptions Ray wraps a worker's failure in."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, WhisperaneError):
            return e
        seen.add(id(e))
        e = e.__cause__ or getattr(e, "cause", None)
    return None


def _start_ray(address: str | None) -> bool:
    """Connect to ``address`` ($RAY_ADDRESS) or start a local Ray for the run; False when this process
    already runs Ray (a caller's, left as it is)."""
    import ray
    from ray.data import DataContext

    debug = bool(os.environ.get("WHISPERANE_DEBUG"))
    DataContext.get_current().enable_progress_bars = False  # whisperane prints its own progress lines
    if not debug:  # Ray Data's execution plan and notes on stderr would bury the one-line errors
        logging.getLogger("ray.data").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    extra = {"num_cpus": os.cpu_count(), "include_dashboard": False} if address == "local" else {}
    ray.init(address=address, log_to_driver=debug, logging_level="INFO" if debug else "ERROR", **extra)
    return True


class _Progress:
    """Files done / total, hours of audio, real-time factor and ETA on stderr, every PROGRESS_INTERVAL_S."""

    def __init__(self, total: int):
        self.total, self.done, self.audio_s = total, 0, 0.0
        self.start = self.last = time.monotonic()

    def update(self, batch: pa.Table) -> None:
        self.done += batch.num_rows
        self.audio_s += sum(d for d in batch.column("duration").to_pylist() if d is not None)
        now = time.monotonic()
        if now - self.last >= PROGRESS_INTERVAL_S or self.done == self.total:
            self.last = now
            wall = now - self.start
            rtf = f"{wall / self.audio_s:.3f}" if self.audio_s else "-"
            eta = math.ceil((self.total - self.done) * wall / self.done)
            _note(f"{self.done}/{self.total} files, {self.audio_s / 3600:.3f} h of audio, RTF {rtf}, "
                  f"ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")  # fmt: skip


def _write_rows(dataset: ray.data.Dataset, out: OutputDir, shard_size: int, total: int) -> int:
    """Rows as they come, in shards of ``shard_size``; rows already received are written even when the run is
    interrupted (they are complete). The number of failed files."""
    progress = _Progress(total)
    pending: list[pa.Table] = []
    failed = 0
    try:
        for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            for error in batch.column("error").drop_null().to_pylist():
                _error(error)
            failed += batch.num_rows - batch.column("error").null_count
            pending.append(batch)
            progress.update(batch)
            while sum(t.num_rows for t in pending) >= shard_size:
                rows = pa.concat_tables(pending, promote_options="default")
                out.write(rows.slice(0, shard_size))
                pending = [rows.slice(shard_size)]
    finally:
        rest = pa.concat_tables(pending, promote_options="default") if pending else None
        if rest is not None and rest.num_rows:
            out.write(rest)
    return failed


def main(argv: list[str] | None = None) -> int:
    """``python -m whisperane.batch INPUT --output OUT ...`` (the same as ``whisperane batch``)."""
    parser = argparse.ArgumentParser(prog="whisperane")
    add_batch_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["batch", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_batch(args)
    except KeyboardInterrupt:
        _error("interrupted; the shards written are complete, a re-run finishes the rest")
        return 130


if __name__ == "__main__":
    sys.exit(main())
