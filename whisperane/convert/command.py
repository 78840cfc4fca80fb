"""``whisperane convert SOURCE``: build a model bundle from a checkpoint, with a progress display on stderr.

The top-level CLI imports this module only for the convert subcommand (torch is slow to import); the
pipeline itself is imported inside :func:`run_convert` so that a missing build dependency becomes a one-line
error instead of an ImportError traceback. :func:`main` is a standalone entry point with only this
subcommand (used by the tests).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from ..errors import ConversionError, WhisperaneError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
SPEAKER_SOURCE = "resemblyzer"  # `whisperane convert resemblyzer`: the speaker encoder for --diarize


class StepProgress:
    """Prints each step the pipeline announces, with the time elapsed since the conversion started.

    The pipeline calls ``progress(msg)`` when a slow step begins; the line of the previous step is the only
    record of how long it took, so each new line also carries the elapsed total.
    """

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def __call__(self, message: str) -> None:
        print(f"whisperane: [{self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)

    def close(self) -> None:
        """Nothing to close: each line is complete as printed."""


class StepBar(StepProgress):
    """The conversion's steps as a tqdm bar on stderr (for a terminal), the step under way as its description."""

    def __init__(self, total: int):
        from tqdm import tqdm

        super().__init__()
        self.bar = tqdm(total=total, unit="step", file=self.stream, dynamic_ncols=True)

    def __call__(self, message: str) -> None:
        self.bar.set_description_str(message if len(message) < 48 else "..." + message[-45:])
        if message.endswith("is up to date") or message.startswith("wrote "):
            self.bar.update(self.bar.total - self.bar.n)
        else:
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def conversion_report(bar: bool) -> StepProgress:
    """What a model conversion reports its steps through: a bar (on a terminal), else a line per step."""
    if not bar:
        return StepProgress()
    from ..contract import ONNX_COMPONENTS
    from .pipeline import INT8_COMPONENTS

    # building, the prefill table, each component exported and each int8 variant, written
    return StepBar(2 + len(ONNX_COMPONENTS) + len(INT8_COMPONENTS) + 1)


def _formats(text: str) -> tuple[str, ...]:
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",") if f.strip()))
    if not formats:
        raise argparse.ArgumentTypeError("expected a comma-separated list such as onnx,coreml")
    return formats


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_convert_parser(subparsers) -> None:
    """Register ``convert`` on an ``argparse`` subparsers object (``parser.add_subparsers()``)."""
    parser = subparsers.add_parser(
        "convert",
        help="convert a Whisper checkpoint into a model bundle",
        description=(
            "Convert a Whisper checkpoint into a model bundle (MelSpectrogram, AudioEncoder, TextDecoder, "
            "TextDecoderContextPrefill, config.json, tokenizer.json). SOURCE is a model name (tiny.en and base "
            "resolve offline), a Hugging Face repo id, or a local checkpoint: a CTranslate2 / faster-whisper "
            "directory, a Hugging Face directory or an OpenAI .pt file. Converting an unchanged source again "
            "is a no-op. SOURCE resemblyzer builds the speaker encoder that --diarize uses."
        ),
    )
    parser.add_argument(
        "source", metavar="SOURCE", help="model name, Hugging Face repo id or checkpoint path"
    )
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="bundle directory (default: models/<name>)"
    )
    parser.add_argument(
        "--formats",
        type=_formats,
        default=("onnx",),
        metavar="LIST",
        help="comma-separated: onnx, coreml (default: onnx)",
    )
    parser.add_argument(
        "--cache-length", type=_positive_int, default=None, metavar="S",
        help="decoder KV-cache length in tokens (default: the model's n_text_ctx, 448)",
    )
    parser.add_argument(
        "--palettize",
        type=int,
        default=None,
        metavar="BITS",
        help="palettize Core ML weights to 4, 6 or 8 bits",
    )
    parser.add_argument(
        "--tokenizer", metavar="DIR", default=None,
        help="directory to read the tokenizer from (required for OpenAI .pt files)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the bundle is up to date")
    parser.set_defaults(handler=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    """Run the conversion described by ``args``; print the bundle path on stdout. Returns the exit code."""
    progress = conversion_report(sys.stderr.isatty() and args.source != SPEAKER_SOURCE)
    try:
        try:
            from .pipeline import convert
            from .speaker import build_speaker_encoder
        except ImportError as err:
            raise ConversionError(
                f"whisperane convert needs the build dependencies ({err}); install them with: "
                "pip install 'whisperane[convert]'"
            ) from err
        if args.source == SPEAKER_SOURCE:
            bundle = build_speaker_encoder(args.out, force=args.force, progress=progress)
        else:
            bundle = convert(
                args.source,
                out_dir=args.out,
                formats=tuple(args.formats),
                cache_length=args.cache_length,
                palettize=args.palettize,
                tokenizer_dir=args.tokenizer,
                force=args.force,
                progress=progress,
            )
    except KeyboardInterrupt:
        # The pipeline builds in a temporary directory that its own cleanup removes on the way out: the
        # previous bundle (if any) is untouched and no partial one claims to be complete.
        print("whisperane: interrupted; no bundle was written", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except WhisperaneError as err:
        print(f"whisperane: error: {err}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    except OSError as err:  # the output directory cannot be written, the disk is full...
        where = f"{err.filename}: " if err.filename else ""
        message = " ".join(f"{where}{err.strerror or err}".split())
        print(f"whisperane: error: {message}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    finally:
        progress.close()
    print(f"whisperane: [{progress.elapsed():6.1f}s] done", file=sys.stderr, flush=True)
    print(bundle, flush=True)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whisperane", description="whisperane model conversion")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_convert_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``whisperane convert ...`` on its own: ``main(["convert", "tiny.en"])``."""
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
