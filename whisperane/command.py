"""Command line: ``whisperane transcribe``, ``convert``, ``models``, ``batch`` and ``stream`` (whisperane/live/command.py).

Every failure prints one line ``whisperane: error: <file>: <cause>`` and the exit status is non-zero (1; 2 for
usage errors; 130 when interrupted by Ctrl-C or SIGTERM). A batch goes on past a bad file and lists the
failures at the end; the model is loaded when the first readable file needs it, so bad inputs fail fast.
Outputs are written atomically (temporary file, rename), so an interrupted run never leaves a partial file
under a final name, and a re-run skips inputs whose outputs all exist unless ``--overwrite``. Files found in a
directory argument keep their subdirectory under the output directory; two inputs that would still write the
same output file are refused rather than overwritten. Native libraries' own messages on file descriptor 2 are
silenced and unforeseen exceptions are reported in one line; ``WHISPERANE_DEBUG=1`` shows both.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .console import ModelUnavailable, describe_error, print_error
from .errors import WhisperaneError
from .options import COMPUTE_TYPES, EXECUTORS
from .result import TranscriptionResult
from .version import __version__
from .writers import OUTPUT_FORMATS, SPEAKER_FORMATS, SUBTITLE_OPTIONS


def add_transcribe_parser(sub) -> None:
    from .arguments import add_option_arguments, str2bool

    p = sub.add_parser("transcribe", help="transcribe audio files to timestamped text",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("audio", nargs="+", help="audio files or directories of audio files")
    add_model_arguments(p)
    p.add_argument("--output-format", "-f", default="json", choices=(*OUTPUT_FORMATS, *SPEAKER_FORMATS, "all"))
    p.add_argument("--output-dir", "-o", default=".", help="directory for the outputs; '-' prints JSON to stdout")
    p.add_argument("--overwrite", action="store_true", help="transcribe again files whose outputs are complete")
    add_option_arguments(p)
    for name in SUBTITLE_OPTIONS:
        kind = str2bool if name == "highlight_words" else int
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=False if kind is str2bool else None)
    p.add_argument("--progress", type=str2bool, default=None, help="progress bar on stderr (default: for long audio on a terminal)")
    p.add_argument("--verbose", action="store_true", help="print each segment as it is decoded")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that pick and load a model (shared by ``transcribe`` and ``batch``)."""
    p.add_argument("--model", default="tiny.en", help="model name (converted on first use) or bundle directory")
    p.add_argument("--executor", default="onnx", choices=EXECUTORS)
    p.add_argument("--compute-units", default="ALL", help="Core ML compute units: ALL, CPU_ONLY, CPU_AND_GPU, CPU_AND_NE")
    p.add_argument("--compute-type", default="default", choices=COMPUTE_TYPES,
                   help="int8 or float32 encoder and decoder (default: int8 on the CPU when the bundle has it)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for the executor (0: all cores)")


def load_model_from_args(args: argparse.Namespace):
    """The model that ``add_model_arguments``' flags name."""
    from . import loading
    from .runtime.sessions import IdleWeights

    # one file at a time: each component's weights leave the resident set while another runs
    return loading.open_model(args.model, executor=args.executor, threads=args.threads or None,
                              compute_units=args.compute_units, compute_type=args.compute_type, wrap=IdleWeights())


@dataclass(frozen=True)
class _Job:
    """One input file and the directory its outputs go to."""

    path: str
    output_dir: str


def _plan_jobs(paths: list[str], output_dir: str) -> list[_Job]:
    """Inputs in order, each file once. Files found in a directory argument keep their subdirectory under the
    output directory, so that ``a/x.wav`` and ``b/x.wav`` do not write the same ``x.json``."""
    from .audio import AUDIO_EXTENSIONS

    jobs: list[_Job] = []
    seen: set[str] = set()
    for p in paths:
        if os.path.isdir(p):
            found = sorted(f for f in Path(p).rglob("*") if f.is_file() and f.suffix.lower() in AUDIO_EXTENSIONS)
            if not found:
                jobs.append(_Job(p, output_dir))  # reported as "no audio files" when its turn comes
            for f in found:
                sub = f.parent.relative_to(p)
                keep_layout = output_dir != "-" and sub != Path(".")
                jobs.append(_Job(str(f), os.path.join(output_dir, sub) if keep_layout else output_dir))
        else:
            jobs.append(_Job(p, output_dir))
    unique = []
    for job in jobs:
        key = os.path.realpath(job.path)
        if key not in seen:
            seen.add(key)
            unique.append(job)
    return unique


def _output_owner(jobs: list[_Job], formats: str) -> dict[str, str]:
    """For each job whose outputs would overwrite those of an earlier one (``x.wav`` and ``x.flac`` in one
    directory), the earlier input's path."""
    from .writers import output_paths

    owners: dict[str, str] = {}
    clashes: dict[str, str] = {}
    for job in jobs:
        if job.output_dir == "-" or os.path.isdir(job.path):
            continue
        for out in output_paths(job.path, job.output_dir, formats):
            key = os.path.normpath(os.path.abspath(out))
            first = owners.setdefault(key, job.path)
            if first != job.path:
                clashes.setdefault(job.path, first)
    return clashes


def run_transcribe(args: argparse.Namespace) -> int:
    from .arguments import options_from_args
    from .writers import outputs_complete

    if args.threads is not None and args.threads < 0:
        print_error("--threads must be >= 0")
        return 2
    options = options_from_args(args)  # an OptionsError is one line and exit 1, before any file is read
    if args.output_format in SPEAKER_FORMATS and not options.diarize:
        print_error(f"--output-format {args.output_format} writes speaker turns: add --diarize")
        return 1
    to_stdout = args.output_dir == "-"
    if not to_stdout:
        try:
            os.makedirs(args.output_dir, exist_ok=True)
        except OSError as e:
            print_error(f"{args.output_dir}: cannot create the output directory ({e.strerror or e})")
            return 1
    jobs = _plan_jobs(args.audio, args.output_dir)
    formats = "json" if to_stdout else args.output_format
    clashes = _output_owner(jobs, formats)
    todo = []
    for job in jobs:
        if to_stdout or args.overwrite or job.path in clashes or not outputs_complete(job.path, job.output_dir, formats):
            todo.append(job)
        else:
            print(f"whisperane: {job.path}: outputs complete, skipped (use --overwrite)", file=sys.stderr)
    failures: list[tuple[str, str]] = []
    run = _FileRunner(args, options, to_stdout)
    for job in todo:
        try:
            run(job, clashes)
        except ModelUnavailable as e:
            print_error(str(e))  # no file can be transcribed without the model
            return 1
        except WhisperaneError as e:
            failures.append((job.path, _report(str(e))))
        except (ValueError, OSError) as e:
            failures.append((job.path, _report(f"{job.path}: {describe_error(e)}")))
        except Exception as e:  # noqa: BLE001 - one bad file must not end a batch, nor print a traceback
            if os.environ.get("WHISPERANE_DEBUG"):
                raise
            failures.append((job.path, _report(f"{job.path}: internal error ({describe_error(e)}); set WHISPERANE_DEBUG=1 for a traceback")))
    if failures and len(todo) > 1:
        print(f"whisperane: {len(failures)} of {len(todo)} file(s) failed:", file=sys.stderr)
        for _path, msg in failures:
            print(f"  {msg}", file=sys.stderr)
    return 1 if failures else 0


class _FileRunner:
    """Transcribes one job and writes its outputs; the model is loaded when the first readable file needs it,
    so bad inputs fail fast, without a model."""

    def __init__(self, args: argparse.Namespace, options, to_stdout: bool):
        self.args, self.options, self.to_stdout = args, options, to_stdout
        self.model = None
        self.writer_options = {k: getattr(args, k) for k in SUBTITLE_OPTIONS}

    def _load(self):
        try:
            return load_model_from_args(self.args)
        except WhisperaneError as e:
            raise ModelUnavailable(str(e)) from None

    def __call__(self, job: _Job, clashes: dict[str, str]) -> None:
        from .audio import open_audio
        from .transcribe import transcribe_with  # looked up at each call: tests replace it in its module

        path, args, t0 = job.path, self.args, time.time()
        if os.path.isdir(path):
            raise WhisperaneError(f"{path}: directory holds no audio files")
        if path in clashes:
            raise WhisperaneError(f"{path}: its outputs would overwrite those of {clashes[path]} (same name); "
                                  "rename one of them or transcribe them into separate output directories")
        with open_audio(path) as stream:  # a bad file fails here, before the model is loaded
            stated = stream.stated_samples  # the progress bar's total: an m4a's stated length spares a decode
            duration = (stream.n_samples if stated is None else stated) / stream.sample_rate
        self.model = self.model or self._load()
        bar = progress_bar(args.progress, duration, path)
        try:  # by path: transcribe() reads it twice (the file's log-mel peak first, as openai-whisper floors it)
            result = transcribe_with(self.model, path, self.options, progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()
        self._write(job, result, t0)

    def _write(self, job: _Job, result: TranscriptionResult, t0: float) -> None:
        from .writers import WriteJSON, get_writer

        if self.args.verbose:
            for s in result.segments:
                print(f"[{s.start:8.2f} --> {s.end:8.2f}] {s.text}", file=sys.stderr)
        if self.to_stdout:
            sys.stdout.write(WriteJSON(".").render(result))
            sys.stdout.flush()
            return
        written = get_writer(self.args.output_format, job.output_dir)(result, job.path, self.writer_options)
        names = ", ".join(str(w) for w in (written if isinstance(written, list) else [written]))
        print(f"whisperane: {job.path} -> {names} ({time.time() - t0:.2f} s)", file=sys.stderr)


def _report(msg: str) -> str:
    print_error(msg)
    return msg


class _Bar:
    def __init__(self, duration: float, name: str):
        from tqdm import tqdm

        self.tqdm = tqdm(total=round(duration, 1), unit="s", desc=os.path.basename(name), file=sys.stderr, leave=False)
        self.done = 0.0

    def update(self, seconds: float, total: float) -> None:
        self.tqdm.total = round(total, 1)
        step = round(seconds, 1) - self.done
        if step > 0:
            self.tqdm.update(step)
            self.done += step

    def close(self) -> None:
        self.tqdm.close()


def progress_bar(flag: bool | None, duration: float, name: str) -> _Bar | None:
    show = flag if flag is not None else (duration > 60 and sys.stderr.isatty())
    return _Bar(duration, name) if show else None


BATCH_HELP = "transcribe a directory, glob or manifest of files on Ray Data into resumable shards"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whisperane", description="Whisper speech-to-text runtime")
    parser.add_argument("--version", action="version", version=f"whisperane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_transcribe_parser(sub)
    from .convert.command import add_convert_parser

    add_convert_parser(sub)
    from .convert.models_command import add_models_parser

    add_models_parser(sub)
    from .live.command import add_stream_parser

    add_stream_parser(sub, add_model_arguments)
    from .server.command import add_serve_parser

    add_serve_parser(sub)
    if argv and argv[0] == "batch":  # its module imports pyarrow (seconds): only when the command is batch
        from .ray_batch.command import add_batch_parser

        add_batch_parser(sub)
    else:
        sub.add_parser("batch", help=BATCH_HELP, add_help=False)
    return parser


def _terminate(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def _native_stderr_silenced():
    """Route ``sys.stderr`` to a copy of file descriptor 2 and point descriptor 2 itself at /dev/null.

    Native libraries write their own warnings straight to descriptor 2 (libmpg123: "Note: Illegal Audio-MPEG-
    Header ..."), which would break the one-line error contract; whisperane's own messages, tracebacks and the
    progress bar go through ``sys.stderr`` and still reach the terminal. ``WHISPERANE_DEBUG=1`` keeps them.
    """
    try:
        fd = sys.stderr.fileno() if sys.stderr is not None else -1
    except (AttributeError, OSError, ValueError):  # replaced by an in-memory stream (pytest's capsys, ...)
        fd = -1
    if fd != 2 or os.environ.get("WHISPERANE_DEBUG"):
        yield
        return
    original = sys.stderr
    original.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stderr = open(saved, "w", buffering=1, encoding=original.encoding, errors="backslashreplace", closefd=False)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        sys.stderr = original
        os.close(saved)
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)  # exits 2 on a usage error
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() else None
    try:
        with _native_stderr_silenced():
            try:
                if args.command == "transcribe":
                    return run_transcribe(args)
                if args.command == "stream":
                    from .live.command import run_stream

                    return run_stream(args, load_model_from_args)
                if args.command == "batch":
                    from .ray_batch.command import run_batch

                    return run_batch(args)
                if args.command == "models":
                    from .convert.models_command import run_models

                    return run_models(args)
                if args.command == "serve":
                    from .server.command import run_serve

                    return run_serve(args)
                from .convert.command import run_convert

                return run_convert(args)
            except KeyboardInterrupt:
                print_error("interrupted; outputs already written are complete, nothing partial was left")
                return 130
            except WhisperaneError as e:
                print_error(str(e))
                return 1
            except Exception as e:  # noqa: BLE001 - the one-line contract holds for the unforeseen too
                if os.environ.get("WHISPERANE_DEBUG"):
                    raise
                print_error(f"internal error ({describe_error(e)}); set WHISPERANE_DEBUG=1 for a traceback")
                return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The console script: ``main``, then an exit that skips the interpreter's teardown (ONNX Runtime's
    sessions, arenas and thread pools, every module's objects): ~0.1 s of an 11 s file's 1.8 s run (tiny.en).
    Everything is written by then: outputs are fsynced and renamed into place, and the two streams flushed here."""
    code = main()
    atexit._run_exitfuncs()  # what a normal exit runs first (logging's flush, a Ray driver's disconnect)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
