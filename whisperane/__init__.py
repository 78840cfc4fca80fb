"""whisperane: Whisper speech-to-text from compiled components driven by a numpy decoder loop."""

from __future__ import annotations

__version__ = "0.1.0"

# Bound after the submodules are imported, so `whisperane.transcribe` is the function (as in openai-whisper),
# not the module of the same name.
from .model import load_model  # noqa: E402
from .transcribe import transcribe  # noqa: E402

__all__ = ["__version__", "load_model", "transcribe"]
