"""``whisperane batch``, the Ray Data command: transcribe a corpus on one machine or a Ray cluster, resumably.

The driver lists the inputs (``ray_batch.inputs``), resolves the model to a bundle once (converting it on first
use) and drops the files whose rows already stand in the output directory (``ray_batch.shards``). Ray Data then
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
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ..console import describe_error, print_error, print_note
from ..errors import WhisperaneError
from ..options import COMPUTE_TYPES
from .dataset import transcribe_dataset
from .inputs import read_inputs, rename_clashes
from .shards import FORMATS, RESULT_COLUMNS, OutputDir, plan

if TYPE_CHECKING:
    import ray.data

PROGRESS_INTERVAL_S = 10.0  # seconds between progress lines on stderr


def add_batch_parser(subparsers) -> None:
    """The ``batch`` subcommand and its arguments (the transcription options are ``transcribe``'s)."""
    p = subparsers.add_parser(
        "batch", help="transcribe a directory, glob or manifest of files on Ray Data into resumable shards",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("input", help="a directory (searched recursively), a glob, or a manifest "
                                 "(.jsonl, .csv, .parquet with a 'path' column; other columns are kept)")
    p.add_argument("--output", "-o", required=True, help="directory of output shards (re-runs resume in it)")
    p.add_argument("--model", default="tiny.en", help="model name (converted once, before the workers start) or bundle directory")
    p.add_argument("--workers", type=int, default=None, help="actors, one model each (default: the cluster's CPUs / threads per worker)")
    p.add_argument("--threads-per-worker", type=int, default=1, help="CPU threads (and Ray CPUs) per worker")
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: $RAY_ADDRESS, else a local Ray for the run)")
    p.add_argument("--format", default="jsonl", choices=sorted(FORMATS), help="shard format")
    p.add_argument("--shard-size", type=int, default=100, help="rows per shard: the unit of resumption")
    p.add_argument("--retry-errors", action="store_true", help="transcribe again the files whose rows hold an error")
    p.add_argument("--compute-type", default="default", choices=COMPUTE_TYPES)
    _add_transcription_options(p)


def _add_transcription_options(parser: argparse.ArgumentParser) -> None:
    from ..arguments import add_option_arguments

    add_option_arguments(parser)


def _transcription_options(args: argparse.Namespace) -> dict:
    """The TranscribeOptions fields the flags give, as keyword arguments of transcribe()."""
    from ..arguments import options_from_args

    return dataclasses.asdict(options_from_args(args))


def run_batch(args: argparse.Namespace) -> int:
    """``whisperane batch``: 0 when every file has a good row, 1 when any failed (their count on stderr) or
    the run could not start, 2 for a bad argument, 130 when interrupted (the shards written stay)."""
    for name, value in (("--workers", args.workers), ("--threads-per-worker", args.threads_per_worker),
                        ("--shard-size", args.shard_size)):
        if value is not None and value < 1:
            print_error(f"{name} must be >= 1")
            return 2
    try:
        import ray  # noqa: F401
    except ImportError:
        print_error("whisperane batch needs Ray: pip install 'whisperane[ray]'")
        return 1
    root = Path(args.output)
    try:
        inputs = read_inputs(args.input)
        options = _transcription_options(args)
        root.mkdir(parents=True, exist_ok=True)
    except (WhisperaneError, TypeError, ValueError) as e:
        print_error(str(e))
        return 1
    except OSError as e:
        print_error(f"{args.output}: cannot create the output directory ({describe_error(e)})")
        return 1
    from filelock import FileLock, Timeout

    try:
        with FileLock(str(root / ".lock"), timeout=0):
            return _run_locked(args, inputs, root, options)
    except Timeout:
        print_error(f"{args.output}: another whisperane batch is writing to this directory")
        return 1


def _run_locked(args: argparse.Namespace, inputs: pa.Table, root: Path, options: dict) -> int:
    from ..loading import resolve_bundle

    settings = {"model": str(args.model), "options": {"compute_type": args.compute_type, **options}}
    try:
        out = OutputDir.open(root, args.format, json.loads(json.dumps(settings)))
        renames = rename_clashes(inputs.column_names, RESULT_COLUMNS)
        inputs = inputs.rename_columns([renames.get(n, n) for n in inputs.column_names])
        paths = inputs.column("path").to_pylist()
        todo, done = plan(out, paths, args.retry_errors)
    except (WhisperaneError, OSError, ValueError) as e:
        print_error(f"{args.output}: {e}" if isinstance(e, OSError) else str(e))
        return 1
    earlier = [out.rows[p].error for p in done if out.rows[p].error is not None]
    if done:
        print_note(f"{len(done)} of {len(paths)} file(s) already have rows in {args.output}, skipped"
              + (f" ({len(earlier)} with errors; --retry-errors retries them)" if earlier else ""))
    failed = 0
    if todo:
        import pyarrow.compute as pc

        try:
            bundle = resolve_bundle(args.model)  # converted here, once, before any worker starts
            todo_rows = inputs.filter(pc.is_in(inputs["path"], pa.array(todo, pa.string())))
            failed = _transcribe_todo(args, todo_rows, out, bundle, options)
        except WhisperaneError as e:
            print_error(str(e))
            return 1
    if failed or earlier:
        print_error(f"{failed + len(earlier)} of {len(paths)} file(s) failed; their rows in {args.output} hold the errors")
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
                       f"{workers * args.threads_per_worker} CPUs; the Ray cluster has {cpus}")
            if started:
                raise WhisperaneError(message)  # a local Ray does not grow: the pool would wait forever
            print_note(f"{message} now (waiting for the cluster to scale up)")
        per_block = max(1, min(args.shard_size, 16, todo.num_rows // (workers * 4)))
        blocks = [todo.slice(i, per_block) for i in range(0, todo.num_rows, per_block)]
        dataset = transcribe_dataset(
            ray.data.from_arrow(blocks), bundle, workers=workers, threads_per_worker=args.threads_per_worker,
            compute_type=args.compute_type, model_label=str(args.model), **options,
        )
        print_note(f"transcribing {todo.num_rows} file(s) with {workers} worker(s) x {args.threads_per_worker} thread(s)")
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
            print_note(f"{self.done}/{self.total} files, {self.audio_s / 3600:.3f} h of audio, RTF {rtf}, "
                  f"ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")


def _write_rows(dataset: ray.data.Dataset, out: OutputDir, shard_size: int, total: int) -> int:
    """Rows as they come, in shards of ``shard_size``; rows already received are written even when the run is
    interrupted (they are complete). The number of failed files."""
    progress = _Progress(total)
    pending: list[pa.Table] = []
    failed = 0
    try:
        for batch in dataset.iter_batches(batch_size=None, batch_format="pyarrow"):
            for error in batch.column("error").drop_null().to_pylist():
                print_error(error)
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
    """``python -m whisperane.ray_batch INPUT --output OUT ...`` (the same as ``whisperane batch``)."""
    parser = argparse.ArgumentParser(prog="whisperane")
    add_batch_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["batch", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_batch(args)
    except KeyboardInterrupt:
        print_error("interrupted; the shards written are complete, a re-run finishes the rest")
        return 130


if __name__ == "__main__":
    sys.exit(main())
