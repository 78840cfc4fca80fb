"""The models a server loads at start, and their ids in requests."""

from __future__ import annotations

import os
from pathlib import Path

from .. import WhisperaneError, load_model


def model_id(name: str) -> str:
    """A model's id in requests: its name, or a bundle directory's name."""
    return Path(name).name if os.sep in name or Path(name).is_dir() else name


def load_models(names: list[str], threads: int = 1, encoder_threads: int | None = None) -> dict:
    """The models by id: each decode on ``threads``, the encoder (one call at a time) on ``encoder_threads``."""
    models = {}
    for name in names:
        key = model_id(name)
        if key in models or key == "whisper-1":
            raise WhisperaneError(f"two models would have the id '{key}'")
        models[key] = load_model(name, threads=threads, encoder_threads=encoder_threads)
    return models
