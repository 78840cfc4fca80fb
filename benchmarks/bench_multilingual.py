"""``multilingual`` on files that change language clip by clip: each clip's WER (CER for ja/zh/ko) inside the file
against the same clip transcribed alone, pooled per language.

    python benchmarks/bench_multilingual.py --model base [--pauses 1.0,0.6,1.5] [--corpus ../shared/corpus] [--out J]
        [--extra DIR ...]
    python benchmarks/bench_multilingual.py --pairs [--repeats 3]
    python benchmarks/bench_multilingual.py --file RECORDING

``--file``: one real recording that changes language once (faster-whisper's ``tests/data/multilingual.mp3``: the
MIT license read in English, then in German), cut at its longest pause (Silero VAD) into its two parts. Each part
alone (its language detected) is the reference; the whole file by default and with ``multilingual``, each part's
text (the segments whose middle falls on its side of the cut) scored against it, with the segments' languages.

The files alternate the corpus's English clips with its clips in other languages, 1 s of silence between clips
(``--pauses``: each file once per pause, the clips pooled over them): one of short clips (the shorter half of the
English ones), one of long ones. Each is transcribed by default
(everything in the first window's language) and with ``multilingual=True``; each clip alone by default (its
language detected) and with its language given. A clip's text in a file is that of the segments whose middle
falls inside it (0.5 s of slack either side). Every clip, in a file and alone, is at CLIP_LEVEL_DBFS.
``--extra``: more folders in the corpus's layout (a manifest.jsonl of clips), their clips joined to the corpus's:
with one clip per language, one word decides a language's figure.

``--pairs``: two speakers answering each other. Each clip in another language is paired with an English clip of
another speaker, both cut to their speech (Silero VAD) and joined by PAIR_PAUSE_S, in both orders: a pause the VAD
regions of ``multilingual`` do not end at. Each file is transcribed with ``multilingual`` alone and with
``multilingual`` and ``diarize`` (speech regions cut where the voice changes); a clip's text is that of the words
whose middle falls inside it (to the middle of the pause). Then the cost of finding the changes before decoding
(``speaker_changes``) on all the pairs joined into one file (1 s between pairs), against the whole transcription
with and without diarize, ``--repeats`` interleaved runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Scorer, load_corpus, loadavg, pct, read_16k_mono  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLE_RATE = 16000
PAUSE_S = 1.0
# Each clip of a file is brought to one level, as one recording's voices are: the clips come from corpora recorded
# 50 dB apart, and Silero VAD misses a voice 45-50 dB below the one a second before it.
CLIP_LEVEL_DBFS = -23.0
MODES = ("alone (detected)", "alone (given)", "file default", "file multilingual")
PAIR_PAUSE_S = 0.25
PAIR_MODES = ("alone (given)", "file multilingual", "file multilingual + diarize")
PAIR_OPTIONS = {"file multilingual": {"multilingual": True},
                "file multilingual + diarize": {"multilingual": True, "diarize": True}}


def build_files(clips) -> dict[str, list]:
    """Two orders of clips: English clips alternating with the others, the short English ones and the long ones."""
    english = sorted((c for c in clips if c.language == "en"), key=lambda c: c.duration)
    others = [c for c in clips if c.language != "en"]
    half = len(english) // 2
    files = {}
    for name, pool in (("short", english[:half]), ("long", english[half:])):
        order = []
        for i, other in enumerate(others):
            order += [pool[i % len(pool)], other]
        files[name] = order + [pool[len(others) % len(pool)]]
    return files


def at_level(samples: np.ndarray, dbfs: float = CLIP_LEVEL_DBFS) -> np.ndarray:
    """``samples`` scaled to an RMS of ``dbfs``."""
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    return (samples * (10 ** (dbfs / 20) / rms)).astype(np.float32) if rms > 0 else samples


def clip_texts(result, spans) -> list[str]:
    """The text of the segments whose middle falls inside each span (seconds), in order."""
    return ["".join(s.text for s in result.segments if a - 0.5 <= (s.start + s.end) / 2 <= b + 0.5) for a, b in spans]


def run(model_name: str, clips: list, pauses: tuple[float, ...] = (PAUSE_S,)) -> dict:
    """Each file of ``build_files`` built with each pause between its clips (a clip's text moves with where it
    starts: several placements pool that out), transcribed by default and multilingual; each clip alone once."""
    import whisperane

    model, scorer = whisperane.load_model(model_name), Scorer()
    errors: dict[str, dict[str, list[int]]] = {m: defaultdict(lambda: [0, 0]) for m in MODES}
    per_clip, timings, alone = [], {}, {}
    for (file_name, order), pause in ((f, p) for f in build_files(clips).items() for p in pauses):
        audio, spans, t = [], [], 0.0
        for clip in order:
            samples = at_level(read_16k_mono(clip.path))
            spans.append((t, t + len(samples) / SAMPLE_RATE))
            audio += [samples, np.zeros(int(pause * SAMPLE_RATE), np.float32)]
            t = spans[-1][1] + pause
        audio = np.concatenate(audio)
        texts = {}
        for mode, options in (("file default", {}), ("file multilingual", {"multilingual": True})):
            started = time.monotonic()
            texts[mode] = clip_texts(model.transcribe(audio, **options), spans)
            timings[f"{file_name} {pause} s {mode}"] = round(time.monotonic() - started, 1)
        for i, clip in enumerate(order):
            if clip.id not in alone:
                samples = at_level(read_16k_mono(clip.path))
                alone[clip.id] = {"alone (detected)": model.transcribe(samples).text,
                                  "alone (given)": model.transcribe(samples, language=clip.language).text}
            row = {"file": file_name, "pause": pause, "clip": clip.id, "language": clip.language, **alone[clip.id],
                   "file default": texts["file default"][i], "file multilingual": texts["file multilingual"][i]}
            for mode in MODES:
                e, n = scorer.errors(clip.text, row[mode], clip.language)
                errors[mode][clip.language][0] += e
                errors[mode][clip.language][1] += n
                row[f"{mode} errors"] = [e, n]
            per_clip.append(row)
    return {"model": model_name, "pauses": list(pauses), "errors": {m: dict(v) for m, v in errors.items()},
            "clips": per_clip, "seconds": timings, "load": loadavg()}


def speech_of(clip) -> np.ndarray:
    """A clip from its first speech to its last (Silero VAD): no silence of its own at either end."""
    from whisperane.vad.regions import VOICED
    from whisperane.vad.silero import get_speech_timestamps

    samples = read_16k_mono(clip.path)
    regions = get_speech_timestamps(samples, VOICED)
    return samples[regions[0].start : regions[-1].end]


def build_pairs(clips) -> list[tuple]:
    """Each clip in another language after and before an English clip (the English of 5-12 s taken in turn, one
    speaker each, so that none is paired twice)."""
    english = [c for c in clips if c.language == "en" and 5 <= c.duration <= 12]
    others = [c for c in clips if c.language != "en"]
    pairs = []
    for i, other in enumerate(others):
        partner = english[i % len(english)]
        pairs += [(partner, other), (other, partner)]
    return pairs


def word_texts(result, spans) -> list[str]:
    """The text of the words whose middle falls inside each span (seconds), widened to the middle of the pause."""
    half = PAIR_PAUSE_S / 2
    words = [w for s in result.segments for w in (s.words or ())]
    return ["".join(w.word for w in words if a - half <= (w.start + w.end) / 2 <= b + half) for a, b in spans]


def joined_by_vad(audio: np.ndarray, cut: float) -> bool:
    """Whether one of ``multilingual``'s VAD regions spans the junction at ``cut`` seconds."""
    from whisperane.audio import AudioStream
    from whisperane.longform.multilingual import REGIONS
    from whisperane.vad.regions import speech_regions
    from whisperane.vad.silero import default_vad

    probabilities, n_samples = default_vad().speech_probabilities(AudioStream.from_array(audio))
    return any(r.start < cut * SAMPLE_RATE < r.end for r in speech_regions(probabilities, n_samples, REGIONS))


def run_pairs(model_name: str, corpus: Path, repeats: int) -> dict:
    import whisperane

    model = whisperane.load_model(model_name)
    scorer, clips = Scorer(), load_corpus(corpus)
    errors: dict[str, dict[str, list[int]]] = {m: defaultdict(lambda: [0, 0]) for m in PAIR_MODES}
    speech, alone, per_file, files = {}, {}, [], []
    for pair in build_pairs(clips):
        for clip in pair:
            if clip.id not in speech:
                speech[clip.id] = speech_of(clip)
                alone[clip.id] = model.transcribe(speech[clip.id], language=clip.language).text
        first, second = (speech[c.id] for c in pair)
        pause = np.zeros(int(PAIR_PAUSE_S * SAMPLE_RATE), np.float32)
        audio = np.concatenate([first, pause, second])
        files.append(audio)
        spans = [(0.0, len(first) / SAMPLE_RATE), ((len(first) + len(pause)) / SAMPLE_RATE, len(audio) / SAMPLE_RATE)]
        row = {"clips": [c.id for c in pair], "joined by the VAD": joined_by_vad(audio, spans[0][1] + PAIR_PAUSE_S / 2)}
        texts = {mode: word_texts(model.transcribe(audio, **PAIR_OPTIONS[mode]), spans) for mode in PAIR_OPTIONS}
        for i, clip in enumerate(pair):
            for mode in PAIR_MODES:
                text = alone[clip.id] if mode == "alone (given)" else texts[mode][i]
                e, n = scorer.errors(clip.text, text, clip.language)
                errors[mode][clip.language][0] += e
                errors[mode][clip.language][1] += n
                row[f"{clip.id} {mode}"] = [text, e, n]
        per_file.append(row)
    seconds = pass_cost(model, files[::2], repeats)
    return {"model": model_name, "errors": {m: dict(v) for m, v in errors.items()}, "files": per_file,
            "seconds": seconds, "load": loadavg()}


def pass_cost(model, pairs: list[np.ndarray], repeats: int) -> dict:
    """Seconds of ``speaker_changes`` alone and of the transcription with and without diarize, on the pairs joined
    into one file, ``repeats`` interleaved runs of each."""
    from whisperane.audio import AudioStream
    from whisperane.diarize.pipeline import speaker_changes

    gap = np.zeros(SAMPLE_RATE, np.float32)
    audio = np.concatenate([piece for pair in pairs for piece in (pair, gap)])
    runs = {"speaker_changes": lambda: speaker_changes(lambda: AudioStream.from_array(audio)),
            **{mode: lambda o=options: model.transcribe(audio, **o) for mode, options in PAIR_OPTIONS.items()}}
    seconds: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for name, call in runs.items():
            started = time.monotonic()
            call()
            seconds[name].append(round(time.monotonic() - started, 2))
    return {"audio": round(len(audio) / SAMPLE_RATE, 1), **seconds}


def report_pairs(data: dict) -> str:
    languages = sorted({lang for mode in data["errors"].values() for lang in mode}, key=lambda x: (x != "en", x))
    joined = sum(row["joined by the VAD"] for row in data["files"])
    lines = [f"model {data['model']}, load {data['load']}, {len(data['files'])} files, {joined} joined into one VAD "
             "region at the pause", "", "| language | " + " | ".join(PAIR_MODES) + " |", "|---|" + "---|" * len(PAIR_MODES)]
    for lang in languages:
        lines.append(f"| {lang} | " + " | ".join(pct(*data["errors"][mode][lang]) for mode in PAIR_MODES) + " |")
    pooled = {m: [sum(v[0] for v in data["errors"][m].values()), sum(v[1] for v in data["errors"][m].values())]
              for m in PAIR_MODES}
    lines.append("| all | " + " | ".join(pct(*pooled[m]) for m in PAIR_MODES) + " |")
    cost = data["seconds"]
    lines += ["", f"one file of the pairs ({cost['audio']} s), seconds per run:"]
    lines += [f"- {k}: median {np.median(v):.2f} (min {min(v):.2f}, max {max(v):.2f})" for k, v in cost.items()
              if k != "audio"]
    return "\n".join(lines)


def run_file(model_name: str, path: Path) -> dict:
    """The recording's two parts (cut at its longest pause) alone, then the whole by default and multilingual."""
    import whisperane
    from whisperane.audio import load_audio
    from whisperane.vad.regions import VOICED
    from whisperane.vad.silero import get_speech_timestamps

    model, scorer = whisperane.load_model(model_name), Scorer()
    audio = load_audio(str(path))
    regions = get_speech_timestamps(audio, VOICED)
    _, i = max((regions[k + 1].start - regions[k].end, k) for k in range(len(regions) - 1))
    cut = (regions[i].end + regions[i + 1].start) // 2
    alone = [whisperane.transcribe(part, model=model) for part in (audio[:cut], audio[cut:])]
    data = {"model": model_name, "file": path.name, "cut_s": cut / SAMPLE_RATE, "load": loadavg(), "modes": {},
            "alone": [{"language": a.language, "text": a.text} for a in alone]}
    for mode, kwargs in (("file default", {}), ("file multilingual", {"multilingual": True})):
        result = whisperane.transcribe(str(path), model=model, **kwargs)
        parts = [[], []]
        for s in result.segments:
            parts[(s.start + s.end) / 2 * SAMPLE_RATE >= cut].append(s)
        data["modes"][mode] = [
            {"errors": scorer.errors(a.text, "".join(s.text for s in segs), a.language),
             "languages": sorted({s.language or result.language for s in segs}), "text": "".join(s.text for s in segs)}
            for a, segs in zip(alone, parts, strict=True)]
    return data


def report_file(data: dict) -> str:
    lines = [f"model {data['model']}, {data['file']} cut at {data['cut_s']:.2f} s, load {data['load']}", "",
             "| part (alone: language) | mode | errors against the part alone | segments' languages |", "|---|---|---|---|"]
    for k, alone in enumerate(data["alone"]):
        for mode, parts in data["modes"].items():
            errors, total = parts[k]["errors"]
            lines.append(f"| {k + 1} ({alone['language']}) | {mode} | {errors}/{total} ({pct(errors, total)} %) | "
                         f"{', '.join(parts[k]['languages'])} |")
    return "\n".join(lines)


def report(data: dict) -> str:
    languages = sorted({lang for mode in data["errors"].values() for lang in mode}, key=lambda x: (x != "en", x))
    lines = [f"model {data['model']}, pauses {data.get('pauses')} s, load {data['load']}", "",
             "| language | clips | units | " + " | ".join(MODES) + " | multilingual - alone (detected) |",
             "|---|---|---|" + "---|" * (len(MODES) + 1)]
    for lang in languages:
        clips = len({row["clip"] for row in data["clips"] if row["language"] == lang})
        cells = [pct(*data["errors"][mode][lang]) for mode in MODES]
        gap = float(cells[MODES.index("file multilingual")]) - float(cells[MODES.index("alone (detected)")])
        units = data["errors"]["alone (detected)"][lang][1]
        lines.append(f"| {lang} | {clips} | {units} | " + " | ".join(cells) + f" | {gap:+.2f} |")
    lines += ["", "seconds: " + ", ".join(f"{k} {v}" for k, v in data["seconds"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="base")
    p.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpus")
    p.add_argument("--out", type=Path, help="write every clip's texts and errors as JSON here")
    p.add_argument("--pairs", action="store_true", help="two speakers in two languages a short pause apart: "
                   "multilingual with and without diarize")
    p.add_argument("--repeats", type=int, default=3, help="with --pairs: interleaved runs timing the pre-pass")
    p.add_argument("--pauses", default=str(PAUSE_S), help="comma-separated pauses (s) between a file's clips: each "
                   "file built once per pause, the clips' errors pooled over them")
    p.add_argument("--file", type=Path, help="a recording that changes language once: its parts in the file "
                   "against the parts alone")
    p.add_argument("--extra", type=Path, action="append", default=[], help="a folder in the corpus's layout "
                   "(manifest.jsonl) whose clips join the corpus's in the files (repeatable)")
    args = p.parse_args(argv)
    os.environ.setdefault("WHISPERANE_THREADS", "2")
    if args.file:
        data = run_file(args.model, args.file)
        print(report_file(data))
        return 0
    for folder in (args.corpus, *args.extra):
        if not (folder / "manifest.jsonl").is_file():
            print(f"no corpus at {folder}", file=sys.stderr)
            return 2
    pauses = tuple(float(x) for x in args.pauses.split(","))
    if args.pairs:
        data = run_pairs(args.model, args.corpus, args.repeats)
    else:
        data = run(args.model, [c for d in (args.corpus, *args.extra) for c in load_corpus(d)], pauses)
    if args.out:
        args.out.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    print(report_pairs(data) if args.pairs else report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
