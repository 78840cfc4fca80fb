"""Random-weight Whisper checkpoints of real shapes, written as a new user's Hugging Face directory would be
(safetensors, config.json, generation_config.json with alignment heads, a complete tokenizer.json).

Their decodings are nonsense by design: timestamps anywhere, end-of-text first, repetition loops. They exercise
the long-form loop on decodings no real model gives on clean speech (test_fuzz.py). Torch and transformers are
imported inside the functions: only the build-side tests pay for them.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

YUE = "<|yue|>"  # Cantonese, the language large-v3 added after <|su|>


@dataclass(frozen=True)
class RandomShape:
    """A checkpoint's shape: mel bins, vocabulary (``en``: tiny.en's, ``multi``: base's 99 languages, ``v3``:
    large-v3's 100), decoder layers, and the seed of its weights."""

    n_mels: int
    vocabulary: str
    decoder_layers: int
    seed: int
    width: int = 64
    heads: int = 2
    text_ctx: int = 448

    @property
    def name(self) -> str:
        return f"m{self.n_mels}-{self.vocabulary}-L{self.decoder_layers}-c{self.text_ctx}-s{self.seed}"


# large-v3-turbo's shape (128 mel bins, the v3 vocabulary, 4 decoder layers), at a width that converts in seconds.
TURBO = RandomShape(n_mels=128, vocabulary="v3", decoder_layers=4, seed=0)


def v3_tokenizer(multilingual: dict) -> dict:
    """large-v3's tokenizer.json from a 99-language one: ``<|yue|>`` after the last language, every special
    token after it one id later (the vocabulary grows from 51865 to 51866)."""
    tok = copy.deepcopy(multilingual)
    ids = {entry["content"]: entry["id"] for entry in tok["added_tokens"]}
    if YUE in ids:
        return tok
    first_after = ids["<|translate|>"]
    for entry in tok["added_tokens"]:
        if entry["id"] >= first_after:
            entry["id"] += 1
    template = dict(tok["added_tokens"][0], id=first_after, content=YUE)
    tok["added_tokens"].append(template)
    tok["added_tokens"].sort(key=lambda entry: entry["id"])
    processor = tok.get("post_processor") or {}
    for special in (processor.get("special_tokens") or {}).values():
        special["ids"] = [i + 1 if i >= first_after else i for i in special["ids"]]
    return tok


def tokenizer_json(shape: RandomShape, tiny_en_dir: Path, base_dir: Path | None) -> dict:
    """The complete tokenizer.json (timestamps included) of ``shape``'s vocabulary."""
    from whisperane.convert.tokenizer_build import build_tokenizer_json

    if shape.vocabulary == "en":
        return build_tokenizer_json(tiny_en_dir, "ctranslate2")
    if base_dir is None:
        raise ValueError(f"{shape.name}: a multilingual vocabulary needs the base checkpoint")
    multilingual = build_tokenizer_json(base_dir, "ctranslate2")
    return v3_tokenizer(multilingual) if shape.vocabulary == "v3" else multilingual


def vocabulary_size(tok: dict) -> int:
    return max(entry["id"] for entry in tok["added_tokens"]) + 1


def write_random_checkpoint(shape: RandomShape, path: Path, tiny_en_dir: Path, base_dir: Path | None = None) -> Path:
    """A Hugging Face directory at ``path`` holding a seeded random Whisper of ``shape``."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    tok = tokenizer_json(shape, tiny_en_dir, base_dir)
    config = WhisperConfig(
        vocab_size=vocabulary_size(tok), num_mel_bins=shape.n_mels, encoder_layers=1,
        decoder_layers=shape.decoder_layers, encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads, d_model=shape.width, encoder_ffn_dim=4 * shape.width,
        decoder_ffn_dim=4 * shape.width, max_source_positions=1500, max_target_positions=shape.text_ctx,
    )
    torch.manual_seed(shape.seed)
    model = WhisperForConditionalGeneration(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    heads = [[layer, head] for layer in range(shape.decoder_layers // 2, shape.decoder_layers)
             for head in range(shape.heads)]
    generation = json.loads((path / "generation_config.json").read_text()) if (path / "generation_config.json").is_file() else {}
    generation["alignment_heads"] = heads
    (path / "generation_config.json").write_text(json.dumps(generation))
    (path / "tokenizer.json").write_text(json.dumps(tok))
    return path
