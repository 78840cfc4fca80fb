"""whisperane: Whisper speech-to-text from four compiled components driven by a numpy decoder loop."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "load_model", "transcribe"]


def __getattr__(name: str):
    # Lazy: `import whisperane` stays cheap (the CLI's start-up time counts in every benchmark).
    if name == "load_model":
        from .model import load_model

        return load_model
    if name == "transcribe":
        from .transcribe import transcribe

        return transcribe
    raise AttributeError(name)
