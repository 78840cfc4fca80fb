"""Words where nobody speaks, speech lost at a window's end (issue 44): corpus clips framed by silence and noise.

Every English corpus clip under 30 s is framed by 15 s of digital silence (zeros) before it and 15 s of low noise
after it (Gaussian, RMS 0.003, about -50 dBFS, 19-34 dB below the clips' RMS), in three variants:

- ``framed``: that alone;
- ``noisy``: the same, plus white noise over the clip at 10 dB SNR against the clip's own RMS;
- ``telephone``: the framed clip through a 4th-order Butterworth band-pass, 300-3400 Hz (scipy, run forwards and
  backwards so that no word time shifts).

All noise is seeded per clip, so every run hears the same audio. The clip's voice is where Silero VAD (the
project's, with the speech guard's ``VOICED`` options: no padding, a 100 ms pause ends a region) hears speech in
the clean clip: first onset to last offset, plus 15 s on the framed timeline. A word is outside the speech when
it starts more than 0.5 s after that voice ends or ends more than 0.5 s before it starts.

Systems, each on every clip and variant with 2 threads, ``language="en"``:

- ``whisperane``: its default mode (``load_model(models/<model>).transcribe(audio)``: int8, greedy with the
  temperature fallback, speech guard on, word timestamps on);
- ``faster-whisper``: int8 on the CTranslate2 weights the bundle is converted from, ``word_timestamps=True`` and
  its own defaults otherwise (beam 5, best of 5, temperatures 0-1 by 0.2, conditioned on the previous text, no
  VAD filter, no hallucination-silence threshold).

Per model, variant and system: the words outside the speech (and the clips with any), WER pooled over the clips
(Whisper's English normalizer, then jiwer over the lists), clips without words; ``--json`` adds every clip's
text, words and the worst offenders.

    PYTHONPATH=$PWD python benchmarks/bench_framed.py [--models tiny.en base] [--systems whisperane faster-whisper]
        [--variants framed noisy telephone] [--clips 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CORPUS = REPO.parent / "shared" / "corpus"
CHECKPOINTS = Path.home() / ".cache" / "whisperane" / "checkpoints"
SAMPLE_RATE = 16000
FRAME_S = 15.0
TAIL_NOISE_RMS = 0.003
SPEECH_SNR_DB = 10.0
BAND_HZ = (300.0, 3400.0)
MARGIN_S = 0.5
SEED = 44
VARIANTS = ("framed", "noisy", "telephone")
WORST = 5  # offenders kept per row in the JSON


@dataclass
class Clip:
    id: str
    text: str
    audio: np.ndarray  # the clean clip, 16 kHz
    voice: tuple[float, float]  # first voice onset, last voice offset, on the framed timeline


def load_clips(corpus: Path, limit: int | None) -> list[Clip]:
    from whisperane.audio import load_audio
    from whisperane.vad.regions import VOICED, speech_regions
    from whisperane.vad.silero import default_vad

    entries = [json.loads(x) for x in (corpus / "manifest.jsonl").read_text().splitlines() if x.strip()]
    entries = [e for e in entries if e["language"] == "en" and e["duration_s"] < 30][:limit]
    vad, clips = default_vad(), []
    for e in entries:
        audio = load_audio(corpus / e["audio"])
        probabilities, n = vad.speech_probabilities(audio)
        regions = speech_regions(probabilities, n, VOICED)
        # A clip the VAD hears nothing in would make every word "outside": take the whole clip instead.
        start, end = (regions[0].start_s, regions[-1].end_s) if regions else (0.0, len(audio) / SAMPLE_RATE)
        clips.append(Clip(e["id"], e["text"], audio, (start + FRAME_S, end + FRAME_S)))
    return clips


def frame(clip: Clip, index: int, variant: str) -> np.ndarray:
    frame_n = round(FRAME_S * SAMPLE_RATE)
    # Seeded by the clip's place, not the variant: the noisy and telephone variants share the framed tail.
    tail = np.random.default_rng((SEED, index)).standard_normal(frame_n) * TAIL_NOISE_RMS
    speech = clip.audio.astype(np.float64)
    if variant == "noisy":
        rms = np.sqrt(np.mean(speech**2))
        noise = np.random.default_rng((SEED, index, 1)).standard_normal(len(speech))
        speech = speech + noise * rms / 10 ** (SPEECH_SNR_DB / 20)
    audio = np.concatenate([np.zeros(frame_n), speech, tail])
    if variant == "telephone":
        from scipy.signal import butter, sosfiltfilt

        sos = butter(4, BAND_HZ, btype="bandpass", fs=SAMPLE_RATE, output="sos")
        audio = sosfiltfilt(sos, audio)
    return np.clip(audio, -1.0, 1.0).astype(np.float32)


def run_whisperane(model, audio: np.ndarray) -> tuple[str, list[tuple[str, float, float]]]:
    result = model.transcribe(audio, language="en")
    return result.text, [(w.word, w.start, w.end) for s in result.segments for w in s.words or ()]


def run_faster_whisper(model, audio: np.ndarray) -> tuple[str, list[tuple[str, float, float]]]:
    segments, _ = model.transcribe(audio, word_timestamps=True, language="en")
    text, words = "", []
    for s in segments:  # a generator: decoding happens while it is consumed
        text += s.text
        words += [(w.word, w.start, w.end) for w in s.words or ()]
    return text, words


def load_system(system: str, model_name: str, threads: int):
    if system == "whisperane":
        import whisperane

        return run_whisperane, whisperane.load_model(REPO / "models" / model_name, threads=threads)
    from faster_whisper import WhisperModel

    model = WhisperModel(str(CHECKPOINTS / model_name), device="cpu", compute_type="int8", cpu_threads=threads)
    return run_faster_whisper, model


def normalized(text: str) -> str:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer

    # An empty hypothesis counts as all deletions: one placeholder word is one substitution in their place.
    return 100 * jiwer.wer([normalized(r) for r in references], [normalized(h) or "<empty>" for h in hypotheses])


def outside(words: list[tuple[str, float, float]], voice: tuple[float, float]) -> list[tuple[str, float, float]]:
    return [w for w in words if w[1] > voice[1] + MARGIN_S or w[2] < voice[0] - MARGIN_S]


def run_row(run, model, clips: list[Clip], model_name: str, variant: str, system: str) -> dict:
    records, wall = [], time.perf_counter()
    for index, clip in enumerate(clips):
        text, words = run(model, frame(clip, index, variant))
        stray = outside(words, clip.voice)
        records.append({"clip": clip.id, "voice": [round(t, 2) for t in clip.voice], "text": text,
                        "wer": wer([clip.text], [text]), "words": [[w, round(a, 2), round(b, 2)] for w, a, b in words],
                        "outside": [[w, round(a, 2), round(b, 2)] for w, a, b in stray]})
    worst = sorted((r for r in records if r["outside"]), key=lambda r: -len(r["outside"]))[:WORST]
    return {"model": model_name, "variant": variant, "system": system, "clips": len(clips),
            "outside_words": sum(len(r["outside"]) for r in records),
            "outside_clips": sum(bool(r["outside"]) for r in records),
            "wer": wer([c.text for c in clips], [r["text"] for r in records]),
            "without_words": sum(not r["words"] for r in records), "wall_s": time.perf_counter() - wall,
            "worst": [{k: r[k] for k in ("clip", "voice", "outside")} for r in worst], "records": records}


def line(row: dict) -> str:
    return (f"| {row['model']} | {row['variant']} | {row['system']} | {row['outside_words']} "
            f"({row['outside_clips']}) | {row['wer']:.2f} | {row['without_words']} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    p.add_argument("--systems", nargs="+", default=["whisperane", "faster-whisper"],
                   choices=["whisperane", "faster-whisper"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--clips", type=int, default=None, help="only the first N clips (smoke runs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    started = time.perf_counter()
    clips = load_clips(args.corpus, args.clips)
    print(f"{len(clips)} English clips under 30 s ({sum(len(c.audio) for c in clips) / SAMPLE_RATE:.0f} s), each "
          f"framed by {FRAME_S:g} s of silence and {FRAME_S:g} s of low noise; threads {args.threads}", flush=True)
    rows = []
    for model_name in args.models:
        systems = {s: load_system(s, model_name, args.threads) for s in args.systems}
        for variant in args.variants:
            for system, (run, model) in systems.items():
                rows.append(run_row(run, model, clips, model_name, variant, system))
                print(f"{line(rows[-1])} {rows[-1]['wall_s']:.0f} s", flush=True)
        del systems  # one model pair in memory at a time
    print("\n| model | variant | system | words outside speech (clips) | WER % | clips without words |\n"
          "|---|---|---|---|---|---|")
    for row in rows:
        print(line(row))
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    if args.json:
        settings = {"tail_noise_rms": TAIL_NOISE_RMS, "speech_snr_db": SPEECH_SNR_DB, "band_hz": BAND_HZ,
                    "frame_s": FRAME_S, "margin_s": MARGIN_S, "seed": SEED, "threads": args.threads}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
