"""Live transcription at real time: ``whisperane stream`` against whisper_streaming (issue 41).

A 2-3 minute English file is built from the corpus clips (in manifest order, 1.5 s of silence between them) and
fed to each system by the wall clock, as if live. Per system and model:

- confirmed latency: a confirmed word's emission (wall time since the stream began) minus its end in the audio
  (the system's own word time); median and p90;
- hypothesis latency: the first wall time a word with the same text and an end within 0.5 s of a confirmed
  word's appeared in any output (hypothesis or confirmed), minus that word's end; median;
- last word: the confirmed latency of the last word of the file (does it keep up?); confirmed max;
- longest gap: the longest wall time without a change of the text on screen (new confirmed words, or a changed
  hypothesis) while speech continued: only the time within the clips counts, not the pauses between them; beside
  it (in parentheses) the longest whole interval between two changes that touched a clip, pauses included;
- done after end: the stream's end (whisperane's "done", whisper_streaming's ``finish()``) after the audio's;
- WER of the final confirmed text (Whisper's English normalizer, then jiwer), beside whisperane's offline
  ``transcribe`` WER on the same file; CPU seconds per audio second (this process, all threads).

whisper_streaming is its ``whisper_online.py`` (github.com/ufal/whisper_streaming), loaded from
``--whisper-streaming PATH`` (kept outside this repository): ``OnlineASRProcessor`` over its faster-whisper
backend (beam 5, word timestamps) on the CTranslate2 weights the bundles are converted from, int8 on the CPU,
min chunk 1.0 s, driven by its own computation-aware loop (sleep until min chunk has arrived, then take all
the audio that arrived, process, repeat). Its module imports librosa only to read files, which this benchmark
does not ask it to: where librosa is missing an empty stand-in module satisfies the import.

    PYTHONPATH=$PWD python benchmarks/bench_stream.py --whisper-streaming /work/team/whisper_streaming/whisper_online.py
    (--seconds 30 for a smoke run on the first 30 s; --models tiny.en; --systems whisperane)

Real-time figures mean something only on a quiet machine: the 1-minute load average is printed before and
after each run (``/proc/loadavg``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CORPUS = REPO.parent / "shared" / "corpus"
SAMPLE_RATE = 16000
PAUSE_S = 1.5
SAME_WORD_WINDOW_S = 0.5
STRIP = ".,!?;:\"'()-"


# --- the file ----------------------------------------------------------------------------------------------


def build_file(work: Path, max_seconds: float | None) -> tuple[Path, str, float]:
    """The English corpus clips (but the 53 s sonnet) with pauses between them: (wav path, reference, seconds)."""
    path, reference, seconds, _ = build_file_with_spans(work, max_seconds)
    return path, reference, seconds


def build_file_with_spans(work: Path, max_seconds: float | None) -> tuple[Path, str, float, list[tuple[float, float]]]:
    """``build_file``, and where each clip lies in the file (seconds): the speech."""
    import soundfile

    from whisperane.audio import load_audio

    entries = [json.loads(x) for x in (CORPUS / "manifest.jsonl").read_text().splitlines() if x.strip()]
    clips = [e for e in entries if e["language"] == "en" and e["duration_s"] < 30]
    pieces, texts, spans, total = [], [], [], 0.0
    for e in clips:
        audio = load_audio(CORPUS / e["audio"])
        if max_seconds is not None and total + len(audio) / SAMPLE_RATE > max_seconds and pieces:
            break
        pieces += [audio, np.zeros(round(PAUSE_S * SAMPLE_RATE), np.float32)]
        texts.append(e["text"])
        spans.append((total, total + len(audio) / SAMPLE_RATE))
        total += len(audio) / SAMPLE_RATE + PAUSE_S
    audio = np.concatenate(pieces[:-1])
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"live-{len(texts)}-clips.wav"
    soundfile.write(path, audio, SAMPLE_RATE, subtype="PCM_16")
    return path, " ".join(texts), len(audio) / SAMPLE_RATE, spans


# --- records -----------------------------------------------------------------------------------------------


@dataclass
class Record:
    """What one system emitted: (wall time, kind, [(text, start, end)]) in order, and its CPU time."""

    outputs: list[tuple[float, str, list[tuple[str, float, float]]]] = field(default_factory=list)
    done_s: float = 0.0  # wall time of the end of the stream (the last text given)
    cpu_s: float = 0.0
    audio_s: float = 0.0
    load: tuple[str, str] = ("", "")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def run_whisperane(model, path: Path, seconds: float, language: str | None, min_chunk: float) -> Record:
    import whisperane
    from whisperane.live import WallClock
    from whisperane.vad.silero import default_vad

    noise = np.random.default_rng(0).standard_normal(SAMPLE_RATE).astype(np.float32) * 0.01
    model.transcribe(noise, language=language)  # warm-up (not digital silence: that is never encoded), as
    default_vad()  # whisper_streaming's loop warms its model up
    record = Record(audio_s=seconds, load=(_loadavg(), ""))
    cpu = _cpu()
    for e in whisperane.stream(path, model, realtime=True, clock=WallClock(), language=language, min_chunk=min_chunk):
        if e.type != "done":
            record.outputs.append((e.wall_time, e.type, [(w.word, w.start, w.end) for w in e.words]))
        else:
            record.done_s = e.wall_time
    record.cpu_s = _cpu() - cpu
    record.load = (record.load[0], _loadavg())
    return record


def load_whisper_streaming(path: Path):
    if importlib.util.find_spec("librosa") is None:
        sys.modules["librosa"] = types.ModuleType("librosa")  # only its file reading uses it (see above)
    spec = importlib.util.spec_from_file_location("whisper_online", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_whisper_streaming(module, ct2_dir: Path, audio: np.ndarray, threads: int, min_chunk: float) -> Record:
    from faster_whisper import WhisperModel

    class CpuFasterWhisper(module.FasterWhisperASR):
        def load_model(self, modelsize=None, cache_dir=None, model_dir=None):
            return WhisperModel(str(model_dir), device="cpu", compute_type="int8", cpu_threads=threads)

    asr = CpuFasterWhisper("en", model_dir=ct2_dir)
    online = module.OnlineASRProcessor(asr, None, buffer_trimming=("segment", 15), logfile=open(os.devnull, "w"))
    asr.transcribe(audio[:SAMPLE_RATE])  # its own warm-up
    duration = len(audio) / SAMPLE_RATE
    record = Record(audio_s=duration, load=(_loadavg(), ""))
    cpu, start, beg, end = _cpu(), time.time(), 0.0, 0.0
    while end < duration:  # whisper_online.py's simultaneous mode
        now = time.time() - start
        if now < end + min_chunk:
            time.sleep(min_chunk + end - now)
        end = time.time() - start
        online.insert_audio_chunk(audio[int(beg * SAMPLE_RATE) : int(end * SAMPLE_RATE)])
        beg, n = end, len(online.commited)
        online.process_iter()
        t = time.time() - start
        new = [(w, a, b) for a, b, w in online.commited[n:]]
        record.outputs.append((t, "confirmed", new))
        record.outputs.append((t, "hypothesis", [(w, a, b) for a, b, w in online.transcript_buffer.complete()]))
    tail = [(w, a, b) for a, b, w in online.transcript_buffer.complete()]
    online.finish()
    record.done_s = time.time() - start
    record.outputs.append((record.done_s, "confirmed", tail))
    record.cpu_s = _cpu() - cpu
    record.load = (record.load[0], _loadavg())
    return record


# --- metrics -----------------------------------------------------------------------------------------------


def _key(text: str) -> str:
    return text.strip().strip(STRIP).lower()


def normalized(text: str) -> str:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


def wer(reference: str, hypothesis: str) -> float:
    import jiwer

    return 100 * jiwer.wer(normalized(reference), normalized(hypothesis) or "<empty>")


def event_times(record: Record) -> list[float]:
    """When the text on screen changed: new confirmed words, or a hypothesis unlike the one before."""
    times, shown = [], None
    for t, kind, words in record.outputs:
        if kind == "confirmed" and words:
            times.append(t)
        elif kind == "hypothesis" and [w[0] for w in words] != shown:
            times.append(t)
            shown = [w[0] for w in words]
    return times


def longest_gap(times: list[float], speech: list[tuple[float, float]]) -> float:
    """The longest time without a change of the text while speech continues: of each wall-time interval between
    two changes (the stream's start the first), the part that lies within the clips (audio time is wall time: the
    file is fed at real time); the pauses between clips are not speech."""
    edges = [0.0, *sorted(times)]
    gaps = [sum(max(0.0, min(b, e) - max(a, s)) for s, e in speech) for a, b in zip(edges, edges[1:], strict=False)]
    return max(gaps, default=0.0)


def longest_gap_touching(times: list[float], speech: list[tuple[float, float]]) -> float:
    """The longest whole interval between two changes of the text that speech arrived in at some moment: with the
    pauses between clips (and the time before the next clip's first word could be shown) counted in."""
    edges = [0.0, *sorted(times)]
    gaps = [b - a for a, b in zip(edges, edges[1:], strict=False) if any(s < b and e > a for s, e in speech)]
    return max(gaps, default=0.0)


def metrics(record: Record, reference: str, speech: list[tuple[float, float]]) -> dict:
    confirmed = [(t, w) for t, kind, words in record.outputs if kind == "confirmed" for w in words]
    seen = [(t, w) for t, _, words in record.outputs for w in words]
    latency, first_seen = [], []
    for t, (text, _, end) in confirmed:
        latency.append(t - end)
        first = min(s for s, (x, _, e) in seen if _key(x) == _key(text) and abs(e - end) <= SAME_WORD_WINDOW_S)
        first_seen.append(first - end)
    last = max(confirmed, key=lambda c: c[1][2]) if confirmed else None
    text = "".join(w[0] if w[0][:1].isspace() else " " + w[0] for _, w in confirmed)
    events = event_times(record)
    return {
        "words": len(confirmed),
        "confirmed_median": float(np.median(latency)) if latency else None,
        "confirmed_p90": float(np.percentile(latency, 90)) if latency else None,
        "confirmed_max": float(max(latency)) if latency else None,
        "longest_gap": longest_gap(events, speech),
        "longest_gap_touching": longest_gap_touching(events, speech),
        "done_after_end": record.done_s - record.audio_s,
        "hypothesis_median": float(np.median(first_seen)) if first_seen else None,
        "last_word": (last[0] - last[1][2]) if last else None,
        "wer": wer(reference, text),
        "cpu_per_audio_s": record.cpu_s / record.audio_s,
        "load": list(record.load),
        "text": text,
        "event_times": [round(t, 3) for t in events],  # for the gaps, recomputed from the JSON
    }


# --- main --------------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    p.add_argument("--systems", nargs="+", default=["whisperane", "whisper_streaming"])
    p.add_argument("--whisper-streaming", type=Path, help="whisper_online.py of ufal/whisper_streaming")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--min-chunk", type=float, nargs="+", default=None,
                   help="whisperane's, one run each (default: its own)")
    p.add_argument("--seconds", type=float, default=None, help="only the clips within the first N seconds")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds of every system")
    p.add_argument("--work", type=Path, default=Path("/tmp/whisperane-bench-stream"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    import whisperane
    from whisperane.audio import load_audio
    from whisperane.convert.sources import resolve_source
    from whisperane.live import LiveOptions

    path, reference, seconds, speech = build_file_with_spans(args.work, args.seconds)
    audio = load_audio(path)
    print(f"file: {path.name}, {seconds:.1f} s; load {_loadavg()}; threads {args.threads}", flush=True)
    module = load_whisper_streaming(args.whisper_streaming) if "whisper_streaming" in args.systems else None
    chunks = args.min_chunk or [LiveOptions().min_chunk]
    systems = [(s, c) for s in args.systems for c in (chunks if s == "whisperane" else [1.0])]
    rows = []
    for model_name in args.models:
        bundle = REPO / "models" / model_name
        model = whisperane.load_model(bundle if bundle.is_dir() else model_name, threads=args.threads)
        language = None if model_name.endswith(".en") else "en"
        offline = wer(reference, model.transcribe(str(path), language=language).text)
        for repeat in range(args.repeats):
            for system, min_chunk in systems:
                if system == "whisperane":
                    record = run_whisperane(model, path, seconds, language, min_chunk)
                else:
                    ct2 = resolve_source(model_name, progress=False).path
                    record = run_whisper_streaming(module, ct2, audio, args.threads, min_chunk)
                row = {"model": model_name, "system": f"{system} (min chunk {min_chunk:g} s)", "repeat": repeat,
                       "offline_wer": offline, **metrics(record, reference, speech)}
                rows.append(row)
                print(_line(row), flush=True)
    print("\nEach round:\n" + HEADER)
    for row in rows:
        print(_line(row))
    print(f"\nMedians of {args.repeats} round(s), [min-max] where several:\n" + HEADER)
    for key in dict.fromkeys((r["model"], r["system"]) for r in rows):
        print(_line(_median_row([r for r in rows if (r["model"], r["system"]) == key])))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


HEADER = ("| model | system | confirmed median / p90 / max (s) | hypothesis median (s) | longest gap in speech (touching) (s) "
          "| done after end (s) "
          "| WER % (offline) | CPU s / audio s | load before / after |\n|---|---|---|---|---|---|---|---|---|")
FIGURES = ("confirmed_median", "confirmed_p90", "confirmed_max", "hypothesis_median", "longest_gap",
           "longest_gap_touching", "done_after_end",
           "wer", "offline_wer", "cpu_per_audio_s")


def _median_row(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds, with its range."""
    row = dict(rounds[0])
    for k in FIGURES:
        values = [r[k] for r in rounds if r[k] is not None]
        row[k] = (float(np.median(values)), min(values), max(values)) if values else None
    row["load"] = [rounds[0]["load"][0], rounds[-1]["load"][1]]
    return row


def _line(r: dict) -> str:
    def f(x):
        if x is None:
            return "-"
        if isinstance(x, tuple):
            return f"{x[0]:.2f} [{x[1]:.2f}-{x[2]:.2f}]" if x[2] > x[1] else f"{x[0]:.2f}"
        return f"{x:.2f}"

    return (f"| {r['model']} | {r['system']} | {f(r['confirmed_median'])} / {f(r['confirmed_p90'])} / "
            f"{f(r['confirmed_max'])} | {f(r['hypothesis_median'])} | {f(r['longest_gap'])} ({f(r['longest_gap_touching'])}) | "
            f"{f(r['done_after_end'])} | {f(r['wer'])} ({f(r['offline_wer'])}) | {f(r['cpu_per_audio_s'])} | "
            f"{r['load'][0]} / {r['load'][1]} |")


if __name__ == "__main__":
    main()
