"""Model dimensions, shared by the build side and the run side (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelDimensions:
    """The hyper-parameters of a Whisper model, named as openai-whisper names them."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelDimensions:
        return cls(**{k: int(d[k]) for k in cls.__dataclass_fields__})

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865
