"""whisperane: Whisper speech-to-text from compiled components driven by a numpy decoder loop."""

from __future__ import annotations

# Bound after the submodules are imported, so `whisperane.transcribe` is the function (as in openai-whisper),
# not the module of the same name.
from .decoding import DecodingResult  # noqa: E402
from .errors import AudioError, ModelError, OptionsError, OutputError, WhisperaneError  # noqa: E402
from .live import LiveTranscriber, StreamEvent, stream  # noqa: E402
from .options import DecodingOptions, TranscribeOptions  # noqa: E402
from .result import Segment, TranscriptionResult, Word  # noqa: E402
from .runtime.model import WhisperaneModel  # noqa: E402
from .transcribe import Transcription, Whisper, WindowDone, load_model, transcribe  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    "AudioError", "DecodingOptions", "DecodingResult", "LiveTranscriber", "ModelError", "OptionsError", "OutputError",
    "Segment", "StreamEvent", "TranscribeOptions", "Transcription", "TranscriptionResult", "WhisperaneError", "Whisper", "WhisperaneModel", "WindowDone", "Word",
    "__version__", "load_model", "stream", "transcribe",
]
