"""What the command lines print: one-line errors and notes on stderr, an exception in one line, and the error
that stops a run when the model cannot be loaded. Shared by ``whisperane transcribe`` and ``whisperane batch``."""

from __future__ import annotations

import sys

from .errors import WhisperaneError


def print_error(msg: str) -> None:
    print(f"whisperane: error: {msg}", file=sys.stderr, flush=True)


def print_note(msg: str) -> None:
    print(f"whisperane: {msg}", file=sys.stderr, flush=True)


def describe_error(e: BaseException) -> str:
    """An exception in one line: its type, and its message with the whitespace collapsed."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class ModelUnavailable(WhisperaneError):
    """The model could not be loaded: no file can be transcribed, so the run stops there."""
