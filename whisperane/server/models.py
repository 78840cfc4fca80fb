"""A model's id in requests (the models a server loads at start: ``scheduling.Schedule.load_models``)."""

from __future__ import annotations

import os
from pathlib import Path

FIRST_MODEL_ID = "whisper-1"  # OpenAI's model name: the first model the server loaded


def model_id(name: str) -> str:
    """A model's id in requests: its name, or a bundle directory's name."""
    return Path(name).name if os.sep in name or Path(name).is_dir() else name
