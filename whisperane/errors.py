"""User-facing errors: each carries a one-line message that the CLI prints without a traceback."""

from __future__ import annotations


class WhisperaneError(Exception):
    """Base class. ``str(err)`` is a single line that names the file and the cause."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class AudioError(WhisperaneError):
    """The audio could not be read or holds no usable samples."""


class OptionsError(WhisperaneError, ValueError):
    """An option has an invalid value (also a ValueError, as a bad argument is in Python)."""


class ModelError(WhisperaneError):
    """A model name, checkpoint or bundle is unknown, unreadable, incomplete or inconsistent."""


class ConversionError(ModelError):
    """Building a bundle from a checkpoint failed."""


class OutputError(WhisperaneError):
    """A result could not be written."""
