"""Command line: ``whisperane transcribe`` and ``whisperane convert``.

Every failure prints one line ``whisperane: error: ...`` and the exit status is non-zero; a batch goes on past
a bad file and reports the failures at the end. Outputs are written atomically, so an interrupted run never
leaves a partial file under a final name.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from . import __version__
from .errors import WhisperaneError

AUDIO_EXTENSIONS = {".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".mp4", ".aac", ".webm", ".wma", ".aiff", ".aif", ".mkv", ".mov"}
OUTPUT_FORMATS = ("json", "txt", "srt", "vtt", "tsv", "all")


def _error(msg: str) -> None:
    print(f"whisperane: error: {msg}", file=sys.stderr, flush=True)


def _str2bool(v: str) -> bool:
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {v!r}")


def _optional_float(v: str) -> float | None:
    return None if v.lower() == "none" else float(v)


def add_transcribe_parser(sub) -> None:
    p = sub.add_parser("transcribe", help="transcribe audio files to timestamped text",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("audio", nargs="+", help="audio files or directories of audio files")
    p.add_argument("--model", default="tiny.en", help="model name (converted on first use) or bundle directory")
    p.add_argument("--executor", default="onnx", choices=["onnx", "coreml"])
    p.add_argument("--compute-units", default="ALL", help="Core ML compute units: ALL, CPU_ONLY, CPU_AND_GPU, CPU_AND_NE")
    p.add_argument("--language", default=None, help="language code (e.g. en, de); detected when omitted")
    p.add_argument("--task", default="transcribe", choices=["transcribe", "translate"])
    p.add_argument("--output-format", "-f", default="json", choices=OUTPUT_FORMATS)
    p.add_argument("--output-dir", "-o", default=".", help="directory for the outputs; '-' prints JSON to stdout")
    p.add_argument("--overwrite", action="store_true", help="transcribe again files whose outputs are complete")
    p.add_argument("--word-timestamps", dest="word_timestamps", action="store_true", default=True)
    p.add_argument("--no-word-timestamps", dest="word_timestamps", action="store_false")
    p.add_argument("--temperature", type=float, default=0.0, help="first sampling temperature")
    p.add_argument("--temperature-increment-on-fallback", type=_optional_float, default=0.2,
                   help="added to the temperature on each fallback; none disables fallback")  # fmt: skip
    p.add_argument("--best-of", type=int, default=5, help="samples at temperature > 0")
    p.add_argument("--initial-prompt", default=None)
    p.add_argument("--condition-on-previous-text", type=_str2bool, default=True)
    p.add_argument("--compression-ratio-threshold", type=_optional_float, default=2.4)
    p.add_argument("--logprob-threshold", type=_optional_float, default=-1.0)
    p.add_argument("--no-speech-threshold", type=_optional_float, default=0.6)
    p.add_argument("--clip-timestamps", default="0", help="start,end,start,end,... seconds to transcribe")
    p.add_argument("--hallucination-silence-threshold", type=_optional_float, default=None)
    p.add_argument("--prefill", default="exact", choices=["exact", "table"], help="exact prefix or the prefill lookup table")
    p.add_argument("--max-line-width", type=int, default=None)
    p.add_argument("--max-line-count", type=int, default=None)
    p.add_argument("--max-words-per-line", type=int, default=None)
    p.add_argument("--highlight-words", type=_str2bool, default=False)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for the executor (0: all cores)")
    p.add_argument("--progress", type=_str2bool, default=None, help="progress bar on stderr (default: for long audio on a terminal)")
    p.add_argument("--verbose", action="store_true", help="print each segment as it is decoded")


def _expand_inputs(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            found = sorted(str(f) for f in Path(p).rglob("*") if f.is_file() and f.suffix.lower() in AUDIO_EXTENSIONS)
            if not found:
                out.append(p)  # reported as "no audio files" below
            out.extend(found)
        else:
            out.append(p)
    return out


def run_transcribe(args: argparse.Namespace) -> int:
    from .audio import open_audio
    from .model import load_model
    from .transcribe import transcribe
    from .writers import get_writer, outputs_complete

    for name, value in (("--threads", args.threads), ("--best-of", args.best_of)):
        if value is not None and value < 0:
            _error(f"{name} must be >= 0")
            return 2
    if args.temperature_increment_on_fallback:
        temps = tuple(round(t, 4) for t in _frange(args.temperature, 1.0 + 1e-6, args.temperature_increment_on_fallback))
    else:
        temps = (args.temperature,)
    to_stdout = args.output_dir == "-"
    if not to_stdout:
        try:
            os.makedirs(args.output_dir, exist_ok=True)
        except OSError as e:
            _error(f"{args.output_dir}: cannot create the output directory ({e.strerror})")
            return 1
    inputs = _expand_inputs(args.audio)
    formats = "json" if to_stdout else args.output_format
    todo = [p for p in inputs if to_stdout or args.overwrite or not outputs_complete(p, args.output_dir, formats)]
    for p in inputs:
        if p not in todo:
            print(f"whisperane: {p}: outputs complete, skipped (use --overwrite)", file=sys.stderr)
    if not todo:
        return 0
    try:
        model = load_model(args.model, executor=args.executor, threads=args.threads or None, compute_units=args.compute_units)
    except WhisperaneError as e:
        _error(str(e))
        return 1
    writer = None if to_stdout else get_writer(args.output_format, args.output_dir)
    writer_opts = {k: getattr(args, k) for k in ("max_line_width", "max_line_count", "max_words_per_line", "highlight_words")}
    failures: list[tuple[str, str]] = []
    for path in todo:
        t0 = time.time()
        try:
            if os.path.isdir(path):
                raise WhisperaneError(f"{path}: directory holds no audio files")
            stream = open_audio(path)
            bar = _progress_bar(args.progress, stream.duration, path)
            try:
                result = transcribe(
                    stream, model, language=args.language, task=args.task, word_timestamps=args.word_timestamps,
                    progress=bar.update if bar else None, temperature=temps, best_of=args.best_of,
                    initial_prompt=args.initial_prompt, condition_on_previous_text=args.condition_on_previous_text,
                    compression_ratio_threshold=args.compression_ratio_threshold, logprob_threshold=args.logprob_threshold,
                    no_speech_threshold=args.no_speech_threshold, clip_timestamps=args.clip_timestamps,
                    hallucination_silence_threshold=args.hallucination_silence_threshold, prefill=args.prefill,
                )  # fmt: skip
            finally:
                stream.close()
                if bar:
                    bar.close()
            data = result.to_dict()
            if args.verbose:
                for s in data["segments"]:
                    print(f"[{s['start']:8.2f} --> {s['end']:8.2f}] {s['text']}", file=sys.stderr)
            if to_stdout:
                from .writers import WriteJSON

                sys.stdout.write(WriteJSON(".").render(data))
                sys.stdout.flush()
            else:
                written = writer(data, path, writer_opts)
                names = ", ".join(str(w) for w in (written if isinstance(written, list) else [written]))
                print(f"whisperane: {path} -> {names} ({time.time() - t0:.2f} s)", file=sys.stderr)
        except WhisperaneError as e:
            _error(str(e))
            failures.append((path, str(e)))
        except (ValueError, OSError) as e:
            msg = f"{path}: {type(e).__name__}: {e}".splitlines()[0]
            _error(msg)
            failures.append((path, msg))
    if failures and len(todo) > 1:
        print(f"whisperane: {len(failures)} of {len(todo)} file(s) failed:", file=sys.stderr)
        for path, _msg in failures:
            print(f"  {path}", file=sys.stderr)
    return 1 if failures else 0


def _frange(start: float, stop: float, step: float):
    t = start
    while t < stop:
        yield t
        t += step


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


def _progress_bar(flag: bool | None, duration: float, name: str) -> _Bar | None:
    show = flag if flag is not None else (duration > 60 and sys.stderr.isatty())
    return _Bar(duration, name) if show else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whisperane", description="Whisper speech-to-text runtime")
    parser.add_argument("--version", action="version", version=f"whisperane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_transcribe_parser(sub)
    from .convert.cli import add_convert_parser

    add_convert_parser(sub)
    return parser


def _terminate(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "transcribe":
            return run_transcribe(args)
        from .convert.cli import run_convert

        return run_convert(args)
    except KeyboardInterrupt:
        _error("interrupted; outputs already written are complete, nothing partial was left")
        return 130
    except WhisperaneError as e:
        _error(str(e))
        return 1


if __name__ == "__main__":
    sys.exit(main())
