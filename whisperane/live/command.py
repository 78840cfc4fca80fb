"""``whisperane stream``: live transcription of a file, raw PCM on standard input, or the microphone.

At the end of the input, or on Ctrl-C (exit 130), the confirmed text is final: it is written with
``--output-dir`` as ``transcribe``'s JSON. Bad input (PCM that ends inside a sample, a device that fails, an
unsupported rate) is one line on stderr after the confirmed text so far is written, and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from ..audio import open_audio
from ..errors import OutputError, WhisperaneError
from ..result import TranscriptionResult
from .chunks import (
    CHUNK_S,
    PCM_FORMATS,
    WallClock,
    arrivals,
    check_sample_rate,
    file_chunks,
    mic_chunks,
    paced,
    pcm_chunks,
)
from .engine import LiveOptions, LiveTranscriber
from .render import JsonLines, PlainText, Terminal

LIVE_HELP = {
    "min_chunk": "seconds of new audio that start an update",
    "pause": "seconds of silence that close an utterance (its tail confirmed there)",
    "trim_after": "the buffer is cut at a confirmed sentence end once longer than this (seconds)",
    "max_buffer": "the buffer is cut at the last confirmed word once longer than this (seconds)",
}


def add_stream_parser(sub, add_model_arguments) -> None:
    from ..arguments import add_option_arguments

    p = sub.add_parser("stream", help="live transcription: confirmed and hypothesis text as audio arrives",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("source", nargs="?", help="an audio file, or '-' for raw mono PCM on standard input")
    p.add_argument("--mic", action="store_true", help="the default input device (needs whisperane[mic])")
    p.add_argument("--realtime", action="store_true",
                   help="live input: a file is paced at real time; each update takes all audio that arrived")
    p.add_argument("--format", dest="output", default="text", choices=["text", "jsonl"], help="output on stdout")
    p.add_argument("--input-format", default="s16le", choices=list(PCM_FORMATS), help="raw PCM on stdin")
    p.add_argument("--sample-rate", type=int, default=16000, help="of raw PCM and the microphone (resampled)")
    p.add_argument("--output-dir", "-o", default=None, help="write the final result here as transcribe's JSON")
    add_model_arguments(p)
    for f in fields(LiveOptions):
        default = f.default if f.default is not MISSING else None
        p.add_argument("--" + f.name.replace("_", "-"), type=float, default=default, help=LIVE_HELP[f.name])
    add_option_arguments(p)


def run_stream(args: argparse.Namespace, load) -> int:
    """``load(args)``: the model (the CLI's own loader)."""
    from ..arguments import options_from_args

    if (args.source is None) == (not args.mic):
        print("whisperane: error: give one source: a file, '-' for standard input, or --mic", file=sys.stderr)
        return 2
    live = LiveOptions(**{f.name: getattr(args, f.name) for f in fields(LiveOptions)})
    options = {**options_from_args(args).to_kwargs(), **{f.name: getattr(live, f.name) for f in fields(live)}}
    name = "mic" if args.mic else "stdin" if args.source == "-" else args.source
    check_sample_rate(args.sample_rate)
    if name not in ("mic", "stdin"):
        with open_audio(name):  # a missing or unreadable file fails here, before the model is loaded
            pass
    model = load(args)
    clock = WallClock()
    transcriber = LiveTranscriber(model, clock=clock.now, **options)
    show = (JsonLines if args.output == "jsonl" else Terminal if sys.stdout.isatty() else PlainText)(sys.stdout).show
    code, message = 0, None
    try:
        for chunk in _chunks(args, name, live, clock):
            show(transcriber.feed(chunk))
        show(transcriber.finish())
    except KeyboardInterrupt:
        code, message = 130, "interrupted; the confirmed text is final"
    except BrokenPipeError:
        code, message = 1, "standard output was closed"
    except (WhisperaneError, OSError, ValueError) as e:
        code, message = 1, " ".join(str(e).split())
    if code:
        try:
            show(transcriber.stop())
        except (BrokenPipeError, OSError):
            pass
    if args.output_dir and (failure := _write(transcriber.result(), args.output_dir, name)):
        code, message = code or 1, failure if not message else f"{message}; {failure}"
    if message:
        print(f"whisperane: error: {message}" if code == 1 else f"whisperane: {message}", file=sys.stderr, flush=True)
    return code


def _chunks(args, name: str, live: LiveOptions, clock: WallClock):
    if name == "mic":
        return arrivals(mic_chunks(args.sample_rate))
    if name == "stdin":
        if args.realtime:
            return arrivals(pcm_chunks(sys.stdin.buffer, args.input_format, args.sample_rate, CHUNK_S))
        return pcm_chunks(sys.stdin.buffer, args.input_format, args.sample_rate, live.min_chunk)
    chunks = file_chunks(name, live.min_chunk)
    return paced(chunks, clock, live.min_chunk) if args.realtime else chunks


def _write(result: TranscriptionResult, output_dir: str, name: str) -> str | None:
    """Write the result as ``<name>.json``; the reason when it cannot be written."""
    from ..writers import get_writer

    try:
        os.makedirs(output_dir, exist_ok=True)
        path = get_writer("json", output_dir)(result, Path(name).name)
    except OutputError as e:  # names the file
        return str(e)
    except OSError as e:
        return f"{output_dir}: cannot write the result ({e.strerror or e})"
    print(f"whisperane: {name} -> {path}", file=sys.stderr, flush=True)
    return None
