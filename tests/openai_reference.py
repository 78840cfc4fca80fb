"""openai-whisper itself as a test-only reference, run on the same weights as whisperane.

openai-whisper (``pip install --no-deps openai-whisper==20250625``, see scripts/setup.sh) builds its torch
``Whisper`` model from the converter's openai-named state dict, so a comparison holds the decoder loop, the
seek rule, the fallback and the word timing to the original implementation rather than to a port of it.
Audio is passed as a float32 16 kHz array: given a path, openai-whisper shells out to ffmpeg.

openai-whisper's results on the long test files and its beam-5 results on test_beam's clips are stored
(``STORED``, written by ``stored_result`` when asked to): a stored result is used only for the very samples and
weights it was computed from (their sha256), else openai-whisper runs. Each file costs openai-whisper about as long as whisperane's own runs of it.

Use it through session fixtures declared in the test module, e.g.::

    @pytest.fixture(scope="session")
    def openai_tiny_en(ct2_tiny_en_dir):
        return openai_reference.load_openai_model(ct2_tiny_en_dir)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # openai-whisper's transcribe() default


def load_openai_model(ct2_dir: str | Path, threads: int = 2) -> Any:
    """An openai-whisper ``whisper.model.Whisper`` (float32, eval mode) holding the weights of a CTranslate2
    checkpoint directory, with the checkpoint's alignment heads.

    ``threads`` sets torch's intra-op threads for the whole process (torch has no per-model setting)."""
    import torch
    from whisper.model import ModelDimensions, Whisper

    from whisperane.convert.checkpoint import load_checkpoint

    torch.set_num_threads(threads)
    checkpoint = load_checkpoint(ct2_dir, "ctranslate2")
    model = Whisper(ModelDimensions(**asdict(checkpoint.dims)))
    state_dict = {
        name: torch.from_numpy(np.ascontiguousarray(w)) for name, w in checkpoint.state_dict.items()
    }
    model.load_state_dict(state_dict, strict=True)
    # What Whisper.set_alignment_heads builds from openai's base85 dump, here from the checkpoint's (layer, head)
    # list: a sparse boolean [n_text_layer, n_text_head] mask.
    heads = torch.zeros(checkpoint.dims.n_text_layer, checkpoint.dims.n_text_head, dtype=torch.bool)
    for layer, head in checkpoint.alignment_heads:
        heads[layer, head] = True
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    return model.float().eval()


def openai_transcribe(
    model: Any,
    audio: np.ndarray,
    *,
    temperature: float | Sequence[float] = DEFAULT_TEMPERATURES,
    word_timestamps: bool = True,
    condition_on_previous_text: bool = True,
    best_of: int | None = 5,
    beam_size: int | None = None,
    patience: float | None = None,
    length_penalty: float | None = None,
    **options: Any,
) -> dict:
    """openai-whisper's ``transcribe()`` result dict (text, segments with words, language) for a float32
    16 kHz mono array, in float32 (``fp16=False``) and silently (``verbose=None``).

    The keywords are openai-whisper's own and default as its ``transcribe()`` does (greedy with the
    temperature fallback, best_of 5 for the sampled temperatures), except ``word_timestamps`` (True, as
    whisperane's default). ``options`` passes any other transcribe or decoding option through unchanged
    (language, initial_prompt, compression_ratio_threshold, clip_timestamps, ...)."""
    import torch
    import whisper

    samples = np.ascontiguousarray(audio, dtype=np.float32)
    temperatures = tuple(temperature) if isinstance(temperature, Sequence) else temperature
    with torch.inference_mode():
        return whisper.transcribe(
            model, samples, verbose=None, fp16=False, temperature=temperatures, word_timestamps=word_timestamps,
            condition_on_previous_text=condition_on_previous_text, best_of=best_of, beam_size=beam_size,
            patience=patience, length_penalty=length_penalty, **options,
        )


def openai_beam_search(
    model: Any,
    audio: np.ndarray,
    *,
    beam_size: int = 5,
    patience: float | None = None,
    length_penalty: float | None = None,
    temperature: float | Sequence[float] = DEFAULT_TEMPERATURES,
    **options: Any,
) -> dict:
    """openai-whisper's transcribe with beam search at temperature 0 (the command line's default beam size 5);
    the sampled fallback temperatures still use ``best_of``. ``patience`` None is openai's 1.0;
    ``length_penalty`` None ranks finished beams by the sum of log-probabilities over the length (openai's
    default), a float alpha by Google NMT's ((5 + length) / 6) ** alpha."""
    return openai_transcribe(model, audio, beam_size=beam_size, patience=patience, length_penalty=length_penalty,
                             temperature=temperature, **options)


STORED = Path(__file__).resolve().parent / "data" / "openai"


def sha256_of(samples: np.ndarray, weights: Path) -> dict[str, str]:
    """The identity of a result: the float32 samples and the checkpoint's weights file (its hash remembered for
    the process: every long file shares it)."""
    from whisperane.convert.sources import file_sha256

    samples = np.ascontiguousarray(samples, dtype=np.float32)
    return {"samples": hashlib.sha256(samples.tobytes()).hexdigest(), "weights": file_sha256(weights)}


def kept_of_result(result: dict) -> dict:
    """What the tests read of a result: its text and language, each segment's seek, times, text and words."""
    segments = [{"seek": s["seek"], "start": s["start"], "end": s["end"], "text": s["text"],
                 "words": [{"word": w["word"], "start": w["start"], "end": w["end"]} for w in s.get("words") or []]}
                for s in result["segments"]]
    return {"text": result["text"], "language": result["language"], "segments": segments}


def stored_result(name: str, samples: np.ndarray, weights: Path, compute: Callable[[], dict],
                  write: bool = False, keep: Callable[[dict], dict] = kept_of_result) -> dict:
    """openai-whisper's result for ``samples`` on ``weights``: the stored one where it was computed from the same
    (``STORED / name``.json), else ``compute()``'s (what ``keep`` keeps of it); ``write``: store that."""
    identity = sha256_of(samples, weights)
    path = STORED / f"{name}.json"
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored["sha256"] == identity:
            return stored["result"]
    result = keep(compute())
    if write:
        STORED.mkdir(exist_ok=True)
        path.write_text(json.dumps({"sha256": identity, "result": result}, ensure_ascii=False, indent=0) + "\n",
                        encoding="utf-8")
    return result
