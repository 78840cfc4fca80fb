"""whisperane against faster-whisper on the same weights: speed, WER, word timing and memory.

Prints markdown tables (see benchmarks/README.md):

- speed: end-to-end wall time of whole processes (imports and model load included), real-time factor and peak RSS
  of whisperane's CLI (its default, int8 decoders on the CPU, and float32) and faster-whisper int8/float32 (beam 1,
  word timestamps on, same threads) on the 11 s JFK clip and a >= 10-minute English file built from the corpus; the cost of word timestamps; whisperane's split into
  mel, encoder and per-token decoder time (measured in this process by wrapping a loaded model's methods);
- wer: every corpus clip and the long file, Whisper's English normalizer then jiwer (CER for ja/zh/ko), and for
  multilingual models the detected language of every non-English clip;
- words: |delta start| / |delta end| of word timestamps against faster-whisper's on clips with identical words;
- rss: peak RSS for 1, 10 and 60 minutes of audio and for 4 threads sharing one model.

Audio built here goes to a cache directory (``--cache``), never into the repository.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RUNNERS = Path(__file__).resolve().parent / "runners.py"
SAMPLE_RATE = 16000
GAP_S = 0.6  # silence between the clips of a built long file
CER_LANGUAGES = {"ja", "zh", "ko"}
SECTIONS = ("speed", "wer", "words", "rss")


# --- corpus and built audio -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    id: str
    path: Path
    text: str
    language: str
    duration: float


@dataclass(frozen=True)
class LongFile:
    path: Path
    duration: float
    reference: str
    spans: tuple[tuple[float, float], ...]  # (start, end) seconds of each clip; silence in between


def load_corpus(corpus: Path) -> list[Clip]:
    clips = []
    with open(corpus / "manifest.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                clips.append(Clip(d["id"], corpus / d["audio"], d["text"], d["language"], float(d["duration_s"])))
    return clips


def read_16k_mono(path: Path) -> np.ndarray:
    import soundfile
    import soxr

    x, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    return soxr.resample(x, sr, SAMPLE_RATE).astype(np.float32) if sr != SAMPLE_RATE else x


def build_long_file(clips: Sequence[Clip], seconds: float, cache: Path, rotate: int = 0) -> LongFile:
    """Concatenate the clips (from clip ``rotate`` on) with short gaps, repeated until >= ``seconds``.

    Written as 16 kHz mono 16-bit wav and cached with its reference (the clips' references in order) and the
    clips' spans."""
    import soundfile

    order = list(clips[rotate:]) + list(clips[:rotate])
    key = hashlib.sha256("|".join(c.id for c in order).encode()).hexdigest()[:10]
    wav = cache / f"english-{int(seconds)}s-gap{GAP_S}-{key}.wav"
    meta = wav.with_suffix(".json")
    if wav.is_file() and meta.is_file():
        m = json.loads(meta.read_text())
        return LongFile(wav, m["duration"], m["reference"], tuple(map(tuple, m["spans"])))
    cache.mkdir(parents=True, exist_ok=True)
    audio = {c.id: read_16k_mono(c.path) for c in order}
    gap = np.zeros(int(GAP_S * SAMPLE_RATE), dtype=np.float32)
    refs: list[str] = []
    spans: list[tuple[float, float]] = []
    n = 0
    tmp = wav.with_suffix(".tmp.wav")
    with soundfile.SoundFile(str(tmp), "w", SAMPLE_RATE, 1, subtype="PCM_16") as out:
        while n < seconds * SAMPLE_RATE:
            for c in order:
                out.write(audio[c.id])
                out.write(gap)
                spans.append((n / SAMPLE_RATE, (n + len(audio[c.id])) / SAMPLE_RATE))
                n += len(audio[c.id]) + len(gap)
                refs.append(c.text)
                if n >= seconds * SAMPLE_RATE:
                    break
    os.replace(tmp, wav)
    result = LongFile(wav, n / SAMPLE_RATE, " ".join(refs), tuple(spans))
    meta.write_text(json.dumps({"duration": result.duration, "reference": result.reference, "spans": spans}))
    return result


# --- measuring child processes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    wall: float
    cpu: float  # user + system seconds: less sensitive than wall time to other load on the machine
    peak_rss_mb: float
    returncode: int
    stderr_tail: str


def run_process(cmd: Sequence[str]) -> Run:
    """Run a command to completion: its wall time, CPU time and peak RSS.

    The command is started by ``runners.py measure``, a fresh small process: on Linux a child's ``ru_maxrss``
    starts from its parent's RSS at fork, and this process grows large once it has loaded models itself."""
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "stderr"), "w+b") as err:
        report = os.path.join(tmp, "run.json")
        p = subprocess.run([sys.executable, str(RUNNERS), "measure", report, "--", *cmd], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=err, check=False)
        err.seek(0)
        tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
        if not os.path.isfile(report):
            return Run(0.0, 0.0, 0.0, p.returncode or 1, tail[0])
        r = json.loads(Path(report).read_text())
    return Run(r["wall_s"], r["cpu_s"], r["peak_rss_kb"] / 1024, r["returncode"], tail[0])


@dataclass
class Engine:
    """One way of transcribing a file in a fresh process; ``command(audio, out_dir)`` writes ``<stem>.json``."""

    label: str
    command: Callable[[Path, Path], list[str]]
    words: bool = True


def whisperane_engine(bundle: Path, threads: int, words: bool = True, compute_type: str = "default") -> Engine:
    """The CLI; "whisperane" is its default compute type (int8 decoders on the CPU), others are named."""

    def command(audio: Path, out_dir: Path) -> list[str]:
        cmd = [sys.executable, "-m", "whisperane", "transcribe", str(audio), "--model", str(bundle), "-o", str(out_dir),
               "--threads", str(threads), "--overwrite", "--compute-type", compute_type]
        return cmd if words else [*cmd, "--no-word-timestamps"]

    name = "whisperane" + ("" if compute_type == "default" else f" {compute_type}")
    return Engine(name + ("" if words else " (no words)"), command, words)


def faster_whisper_engine(model_dir: Path, compute_type: str, threads: int, language: str | None,
                          words: bool = True) -> Engine:
    def command(audio: Path, out_dir: Path) -> list[str]:
        cmd = [sys.executable, str(RUNNERS), "faster-whisper", str(audio), str(out_dir / f"{audio.stem}.json"),
               "--model-path", str(model_dir), "--compute-type", compute_type, "--threads", str(threads)]
        if language:
            cmd += ["--language", language]
        return cmd if words else [*cmd, "--no-word-timestamps"]

    return Engine(f"faster-whisper {compute_type}" + ("" if words else " (no words)"), command, words)


# --- text metrics ---------------------------------------------------------------------------------------------


class Scorer:
    def __init__(self):
        from whisper_normalizer.basic import BasicTextNormalizer
        from whisper_normalizer.english import EnglishTextNormalizer

        self.english = EnglishTextNormalizer()
        self.basic = BasicTextNormalizer()

    def units(self, text: str, language: str) -> list[str]:
        """What errors are counted over: normalized words, or characters for ja/zh/ko."""
        if language == "en":
            return self.english(text).split()
        norm = self.basic(text)
        return list(norm.replace(" ", "")) if language in CER_LANGUAGES else norm.split()

    def errors(self, reference: str, hypothesis: str, language: str) -> tuple[int, int]:
        """(edit errors, reference length) in units."""
        import jiwer

        ref = self.units(reference, language)
        hyp = self.units(hypothesis, language)
        if not ref:
            return len(hyp), 0
        if not hyp:
            return len(ref), len(ref)
        out = jiwer.process_words(" ".join(ref), " ".join(hyp))
        return out.substitutions + out.deletions + out.insertions, len(ref)


def pct(errors: int, total: int) -> str:
    return f"{100 * errors / total:.2f}" if total else "-"


# --- in-process transcription ---------------------------------------------------------------------------------


@dataclass
class Transcript:
    text: str
    language: str
    words: list[tuple[str, float, float]] = field(default_factory=list)
    language_probability: float | None = None


def from_json(d: dict) -> Transcript:
    words = [(w["word"], w["start"], w["end"]) for s in d["segments"] for w in (s.get("words") or [])]
    return Transcript(d["text"], d["language"], words)


def whisperane_transcript(model, path: Path, language: str | None) -> Transcript:
    from whisperane.transcribe import transcribe

    r = transcribe(str(path), model, language=language, word_timestamps=True)
    t = from_json(r.to_dict())
    t.language_probability = (r.language_probs or {}).get(r.language)
    return t


def faster_whisper_transcript(model, path: Path, language: str | None) -> Transcript:
    segments, info = model.transcribe(str(path), beam_size=1, word_timestamps=True, language=language)
    segments = list(segments)
    words = [(w.word, w.start, w.end) for s in segments for w in s.words or []]
    return Transcript("".join(s.text for s in segments), info.language, words, info.language_probability)


class ComponentClock:
    """Times a loaded WhisperaneModel's component calls by wrapping its bound methods on the instance.

    Nested calls (a multi-token call falling back to single steps) are counted once, at the outer level."""

    METHODS = ("log_mel", "encode", "step", "forward_tokens", "score_tokens")

    def __init__(self, model):
        self.model = model
        self.seconds = dict.fromkeys(self.METHODS, 0.0)
        self.calls = dict.fromkeys(self.METHODS, 0)
        self._depth = 0
        # the decoder adapter's step, multi-token forward and teacher-forced scoring (the word-alignment pass), the
        # model's mel and encoder
        self._targets = {"log_mel": (model, "log_mel"), "encode": (model, "encode"),
                         "step": (model.decoder, "step"), "forward_tokens": (model.decoder, "forward"),
                         "score_tokens": (model.decoder, "score")}
        for name, (owner, attr) in self._targets.items():
            setattr(owner, attr, self._wrap(name, getattr(owner, attr)))

    def _wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                self._depth -= 1
                if self._depth == 0:
                    self.seconds[name] += dt
                    self.calls[name] += 1

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.METHODS, 0.0)
        self.calls = dict.fromkeys(self.METHODS, 0)

    def remove(self) -> None:
        for owner, attr in self._targets.values():
            delattr(owner, attr)


# --- output -------------------------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def emit(text: str = "") -> None:
    print(text, flush=True)


def progress(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def section(title: str) -> None:
    emit(f"\n## {title}\n")
    emit(f"_load average at start: {loadavg()}_\n")


def header(args: argparse.Namespace) -> None:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), cpu)
        flags = set(next((x.split(":", 1)[1].split() for x in info if x.startswith("flags")), []))
    except OSError:
        pass
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags) or "n/a"

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    emit("# whisperane benchmark\n")
    emit(f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    emit(f"- CPU: {cpu} ({isa}); {os.cpu_count()} cores; load average {loadavg()}")
    emit(f"- Python {platform.python_version()} on {platform.platform()}")
    emit("- versions: " + ", ".join(f"{p} {version(p)}" for p in ("whisperane", "onnxruntime", "faster-whisper",
                                                                   "ctranslate2", "numpy")))
    emit(f"- settings: models {args.models}; {args.threads} threads; beam 1 (greedy, temperature fallback); "
         f"word timestamps on unless noted; {'quick' if args.quick else 'full'} run")


# --- the benchmark --------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.models = [m.strip() for m in args.models.split(",") if m.strip()]
        self.corpus = load_corpus(Path(args.corpus))
        self.english = [c for c in self.corpus if c.language == "en"]
        self.cache = Path(args.cache)
        self.work = Path(tempfile.mkdtemp(prefix="whisperane-bench-"))
        self.scorer = Scorer()
        self._bundles: dict[str, Path] = {}
        self._long: dict[tuple[float, int], LongFile] = {}
        self.long_outputs: dict[tuple[str, str], Transcript] = {}  # (model, engine) -> long-file transcript
        self.long_runs: dict[str, Run] = {}  # model -> whisperane's run on the long file (reused by the rss section)
        self.clip_results: dict[str, dict[str, dict[str, Transcript]]] = {}  # model -> engine -> clip id

    # resources

    def bundle(self, model: str) -> Path:
        if model not in self._bundles:
            from whisperane.loading import resolve_bundle

            self._bundles[model] = resolve_bundle(model).resolve()  # converts it on first use (minutes)
        return self._bundles[model]

    @staticmethod
    def ct2_dir(model: str) -> Path:
        from whisperane.convert.sources import resolve_source

        return Path(resolve_source(model).path)

    @staticmethod
    def fixed_language(model: str) -> str | None:
        return "en" if model.endswith(".en") else None

    def long_file(self, minutes: float, rotate: int = 0) -> LongFile:
        key = (minutes, rotate)
        if key not in self._long:
            self._long[key] = build_long_file(self.english, minutes * 60, self.cache, rotate)
        return self._long[key]

    def jfk(self) -> Clip:
        return next(c for c in self.corpus if c.id == "jfk")

    def engines(self, model: str, with_no_words: bool) -> list[Engine]:
        t, lang, ct2 = self.args.threads, self.fixed_language(model), self.ct2_dir(model)
        engines = [whisperane_engine(self.bundle(model), t), whisperane_engine(self.bundle(model), t, compute_type="float32"),
                   faster_whisper_engine(ct2, "int8", t, lang), faster_whisper_engine(ct2, "float32", t, lang)]
        if with_no_words:
            engines += [whisperane_engine(self.bundle(model), t, words=False),
                        faster_whisper_engine(ct2, "int8", t, lang, words=False)]
        return engines

    def measure(self, engines: Sequence[Engine], audio: Path, repeats: int | dict[str, int], tag: str
                ) -> dict[str, list[Run]]:
        """Each engine ``repeats`` times (a count, or one per engine label), interleaved run by run so that
        background load hits them alike."""
        counts = repeats if isinstance(repeats, dict) else {e.label: repeats for e in engines}
        runs: dict[str, list[Run]] = {e.label: [] for e in engines if counts.get(e.label, 0) > 0}
        for rep in range(max(counts.values(), default=0)):
            for e in engines:
                if rep >= counts.get(e.label, 0):
                    continue
                out = self.work / tag / e.label.replace(" ", "_").replace("(", "").replace(")", "")
                out.mkdir(parents=True, exist_ok=True)
                run = run_process(e.command(audio, out))
                runs[e.label].append(run)
                progress(f"{tag} {e.label}: {run.wall:.2f} s wall, {run.cpu:.2f} s CPU, rc {run.returncode}")
        return runs

    def output_of(self, engine: Engine, tag: str, audio: Path) -> Transcript | None:
        out = self.work / tag / engine.label.replace(" ", "_").replace("(", "").replace(")", "") / f"{audio.stem}.json"
        return from_json(json.loads(out.read_text(encoding="utf-8"))) if out.is_file() else None

    # sections

    def speed(self) -> None:
        args = self.args
        section("Speed: end-to-end wall time of a fresh process (issue 3)")
        long = self.long_file(args.long_minutes)
        jfk = self.jfk()
        n_long = 1 if args.quick else args.long_repeats
        rows, cost_rows = [], []
        for i, model in enumerate(self.models):
            # The long file dominates the run time: the comparison that decides (whisperane vs faster-whisper int8)
            # gets --long-repeats runs; whisperane without word timestamps runs once for the first model; the
            # other engines only with --long-engines all.
            secondary = 1 if args.long_engines == "all" else 0
            long_repeats = {"whisperane": n_long, "faster-whisper int8": n_long, "faster-whisper float32": secondary,
                            "whisperane float32": secondary,
                            "whisperane (no words)": 1 if (i == 0 and not args.quick) or secondary else 0,
                            "faster-whisper int8 (no words)": secondary}
            files = [("jfk", jfk.path, jfk.duration, args.repeats), ("long", long.path, long.duration, long_repeats)]
            for name, path, duration, repeats in files:
                engines = self.engines(model, with_no_words=True)
                tag = f"speed-{model}-{name}"
                runs = self.measure(engines, path, repeats, tag)
                ok = {k: v for k, v in runs.items() if all(x.returncode == 0 for x in v)}
                med = {k: statistics.median(r.wall for r in v) for k, v in ok.items()}
                peer = med.get("faster-whisper int8")
                for e in engines:
                    rs = runs.get(e.label)
                    if not rs:
                        continue
                    label = [model, f"{name} ({duration:.0f} s)", e.label]
                    if e.label not in ok:
                        rows.append([*label, "failed", "", "", "", "", rs[-1].stderr_tail])
                        continue
                    wall = med[e.label]
                    speedup = f"{peer / wall:.2f}x" if peer and e.words else ""
                    rows.append([*label, f"{wall:.2f}", f"{statistics.median(r.cpu for r in rs):.2f}",
                                 f"{wall / duration:.3f}", f"{max(r.peak_rss_mb for r in rs):.0f}", speedup,
                                 ", ".join(f"{r.wall:.2f}" for r in rs)])
                    if name == "long" and e.words:
                        t = self.output_of(e, tag, path)
                        if t is not None:
                            self.long_outputs[(model, e.label)] = t
                if name == "long" and "whisperane" in ok:
                    self.long_runs[model] = max(ok["whisperane"], key=lambda r: r.peak_rss_mb)
                for engine in ("whisperane", "faster-whisper int8"):
                    on, off = med.get(engine), med.get(f"{engine} (no words)")
                    if on and off:
                        cost_rows.append([model, name, engine, f"{off:.2f}", f"{on:.2f}", f"{on - off:+.2f}",
                                          f"{100 * (on - off) / off:+.0f}%"])
        emit(f"Median of {args.repeats} runs on JFK; on the long file {n_long} for whisperane and faster-whisper int8 "
             "(the other engines: see `--long-engines`). Runs are interleaved. Wall time includes interpreter start, "
             "imports and model load; RTF = wall / audio duration; CPU s = user + system time of the process (less "
             "sensitive than wall time to other load on the machine); peak RSS = `ru_maxrss` of the process "
             "(`os.wait4`); speed-up = faster-whisper int8 wall / wall.\n")
        emit(table(["model", "file", "engine", "wall s", "CPU s", "RTF", "peak RSS MB", "speed-up vs fw int8",
                    "runs (s)"], rows))
        emit("\n### Cost of word timestamps (issue 4)\n")
        emit("Median wall time of the same engine with word timestamps off and on (same runs as above).\n")
        emit(table(["model", "file", "engine", "no words s", "words s", "difference s", "relative"], cost_rows))
        one_minute = self.long_file(1)
        self.split([("jfk", jfk.path, jfk.duration), ("1 min", one_minute.path, one_minute.duration)])

    def split(self, files: Sequence[tuple[str, Path, float]]) -> None:
        from whisperane import load_model
        from whisperane.transcribe import transcribe

        emit("\n### whisperane time split (in-process, model loaded and warmed up on JFK first)\n")
        emit("Measured by wrapping the loaded model's `log_mel`, `encode`, `step` (one token per sequence) and "
             "`forward` and `score` (prompt/prefix and the word-alignment pass) methods; `rest` is everything else: "
             "audio decoding, logit filters, DTW, Python. Per-window and per-step costs do not depend on the file's "
             "length, so a 1-minute file built like the long one stands for it.\n")
        rows = []
        for model_name in self.models:
            model = load_model(self.bundle(model_name), threads=self.args.threads)
            clock = ComponentClock(model)
            transcribe(str(self.jfk().path), model, language=self.fixed_language(model_name))  # warm-up
            for name, path, duration in files:
                clock.reset()
                t0 = time.perf_counter()
                transcribe(str(path), model, language=self.fixed_language(model_name))
                total = time.perf_counter() - t0
                progress(f"split {model_name} {name}: {total:.2f} s")
                s, c = clock.seconds, clock.calls
                rest = total - sum(s.values())
                rows.append([
                    model_name, f"{name} ({duration:.0f} s)", c["encode"],
                    f"{1000 * s['log_mel'] / max(c['log_mel'], 1):.1f}", f"{1000 * s['encode'] / max(c['encode'], 1):.0f}",
                    c["step"], f"{1000 * s['step'] / max(c['step'], 1):.2f}",
                    f"{s['log_mel']:.2f} / {s['encode']:.2f} / {s['step']:.2f} / {s['forward_tokens'] + s['score_tokens']:.2f} / {rest:.2f}",
                    f"{total:.2f}", f"{total / duration:.3f}",
                ])
            clock.remove()
            del model
        emit(table(["model", "file", "windows", "mel ms/window", "encoder ms/window", "decoder steps", "decoder ms/step",
                    "s: mel / encoder / steps / multi-token / rest", "total s", "RTF"], rows))

    def transcribe_clips(self, model: str) -> dict[str, dict[str, Transcript]]:
        """Every clip the model can transcribe, in this process: whisperane and faster-whisper int8/float32."""
        if model in self.clip_results:
            return self.clip_results[model]
        from faster_whisper import WhisperModel

        from whisperane import load_model

        clips = self.english if self.fixed_language(model) else self.corpus
        lang = self.fixed_language(model)
        results: dict[str, dict[str, Transcript]] = {}
        for label, compute_type in (("whisperane", "default"), ("whisperane float32", "float32")):
            wm = load_model(self.bundle(model), threads=self.args.threads, compute_type=compute_type)
            t0 = time.perf_counter()
            results[label] = {c.id: whisperane_transcript(wm, c.path, lang) for c in clips}
            progress(f"clips {model} {label}: {time.perf_counter() - t0:.1f} s")
            del wm
        for ct in ("int8", "float32"):
            t0 = time.perf_counter()
            fm = WhisperModel(str(self.ct2_dir(model)), device="cpu", compute_type=ct, cpu_threads=self.args.threads)
            results[f"faster-whisper {ct}"] = {c.id: faster_whisper_transcript(fm, c.path, lang) for c in clips}
            progress(f"clips {model} faster-whisper {ct}: {time.perf_counter() - t0:.1f} s")
            del fm
        self.clip_results[model] = results
        return results

    def wer(self) -> None:
        section("Accuracy: WER against the corpus references (issue 3)")
        emit("Greedy (beam 1) with the default temperature fallback and word timestamps on; faster-whisper runs the same "
             "CTranslate2 weights the whisperane bundle was converted from. WER after Whisper's English normalizer "
             "(`whisper_normalizer`), then jiwer; totals are corpus-level (all errors / all reference words). Non-English "
             "clips: BasicTextNormalizer, CER for ja/zh/ko.\n")
        engines = ("whisperane", "whisperane float32", "faster-whisper int8", "faster-whisper float32")
        summary = []
        for model in self.models:
            t0 = time.perf_counter()
            res = self.transcribe_clips(model)
            elapsed = time.perf_counter() - t0
            clips = [c for c in self.corpus if c.id in res["whisperane"]]
            rows, totals = [], {e: [0, 0] for e in engines}
            for c in clips:
                row = [c.id, c.language, f"{c.duration:.1f}"]
                for e in engines:
                    err, n = self.scorer.errors(c.text, res[e][c.id].text, c.language)
                    row.append(pct(err, n))
                    if c.language == "en":
                        totals[e][0] += err
                        totals[e][1] += n
                rows.append(row)
            emit(f"\n### {model}: per clip (WER %, CER % for ja/zh/ko; transcribed in {elapsed:.0f} s)\n")
            emit(table(["clip", "lang", "s", *engines], rows))
            long = self.long_file(self.args.long_minutes)
            long_row = []
            for e in engines:
                t = self.long_outputs.get((model, e))
                if t is None and self.args.long_engines != "all" and e not in ("whisperane", "faster-whisper int8"):
                    long_row.append("not run (`--long-engines all`)")
                    continue
                if t is None:
                    t = self.transcribe_long(model, e, long.path)
                err, n = self.scorer.errors(long.reference, t.text, "en")
                long_row.append(f"{pct(err, n)}{'' if long_segments_ok(t) else ' (!)'}")
            summary.append([model, "English clips", *(pct(*totals[e]) for e in engines)])
            summary.append([model, f"long file ({long.duration / 60:.1f} min)", *long_row])
            if not self.fixed_language(model):
                self.languages(model, res)
        emit("\n### Overall English WER %\n")
        emit(table(["model", "audio", *engines], summary))

    def transcribe_long(self, model: str, label: str, path: Path) -> Transcript:
        engine = next(e for e in self.engines(model, with_no_words=False) if e.label == label)
        tag = f"long-{model}"
        run = self.measure([engine], path, 1, tag)[label][0]
        if run.returncode:
            raise SystemExit(f"{label} failed on {path}: {run.stderr_tail}")
        if label == "whisperane":
            self.long_runs.setdefault(model, run)
        t = self.output_of(engine, tag, path)
        self.long_outputs[(model, label)] = t
        return t

    def languages(self, model: str, res: dict[str, dict[str, Transcript]]) -> None:
        engines = ("whisperane", "faster-whisper int8", "faster-whisper float32")
        rows, agree = [], dict.fromkeys(engines, 0)
        others = [c for c in self.corpus if c.language != "en" and c.id in res["whisperane"]]
        for c in others:
            row = [c.id, c.language]
            for e in engines:
                t = res[e][c.id]
                p = f" ({t.language_probability:.2f})" if t.language_probability is not None else ""
                row.append(f"{t.language}{p}")
                agree[e] += t.language == c.language
            rows.append(row)
        rows.append(["**correct**", "", *(f"{agree[e]}/{len(others)}" for e in engines)])
        emit(f"\n### {model}: language detection of the non-English clips (detected language, probability)\n")
        emit(table(["clip", "manifest", *engines], rows))

    def words(self) -> None:
        section("Word timing: whisperane vs faster-whisper word timestamps (issue 4)")
        emit("Corpus clips where both produce the same words (compared after stripping spaces); |delta| in ms over all "
             "their words.\n")
        rows = []
        for model in self.models:
            res = self.transcribe_clips(model)
            for ref in ("faster-whisper float32", "faster-whisper int8"):
                d_start, d_end, same = [], [], 0
                for cid, ours in res["whisperane"].items():
                    theirs = res[ref][cid]
                    if [w[0].strip() for w in ours.words] != [w[0].strip() for w in theirs.words] or not ours.words:
                        continue
                    same += 1
                    d_start += [abs(a[1] - b[1]) for a, b in zip(ours.words, theirs.words, strict=True)]
                    d_end += [abs(a[2] - b[2]) for a, b in zip(ours.words, theirs.words, strict=True)]
                if not d_start:
                    rows.append([model, ref, f"0/{len(res['whisperane'])}", 0, "", "", "", "", "", ""])
                    continue
                s, e = 1000 * np.asarray(d_start), 1000 * np.asarray(d_end)
                rows.append([model, ref, f"{same}/{len(res['whisperane'])}", len(s),
                             f"{np.median(s):.0f}", f"{np.percentile(s, 95):.0f}", f"{s.max():.0f}",
                             f"{np.median(e):.0f}", f"{np.percentile(e, 95):.0f}", f"{e.max():.0f}"])
        emit(table(["model", "against", "clips", "words", "median dstart", "p95 dstart", "max dstart", "median dend",
                    "p95 dend", "max dend"], rows))
        long = self.long_file(self.args.long_minutes)
        rows = []
        for (model, engine), t in sorted(self.long_outputs.items()):
            rows.append([model, engine, *gap_check(t, long.spans)])
        emit(f"\nLong file ({long.duration / 60:.1f} min, clips {GAP_S} s apart), word timestamps of the speed runs: "
             "words that start inside a gap between clips, and how far each clip's first word starts from the clip's "
             "start (a clip's words are those whose middle falls inside it).\n")
        if rows:
            emit(table(["model", "engine", "words", "starts inside a gap", "clips", "median first-word offset ms",
                        "max ms", "clips > 300 ms"], rows))
        else:
            emit("_(no long-file transcripts: run with the speed section)_")

    def rss(self) -> None:
        args = self.args
        section("Memory: peak RSS against audio length and under threads (issue 5)")
        model = self.models[0]
        engine = whisperane_engine(self.bundle(model), args.threads)
        minutes = [1, 10] if args.quick else [1, 10, 60]
        rows = []
        for m in minutes:
            f = self.long_file(m)
            run = self.long_runs.get(model) if m == args.long_minutes else None
            if run is None:
                run = self.measure([engine], f.path, 1, f"rss-{m}")[engine.label][0]
            status = "ok" if run.returncode == 0 else f"failed: {run.stderr_tail}"
            rows.append([model, f"{f.duration / 60:.1f} min", f"{run.wall:.1f}", f"{run.wall / f.duration:.3f}",
                         f"{run.peak_rss_mb:.0f}", status])
        emit(f"whisperane CLI, one process per file, {args.threads} threads, word timestamps on.\n")
        emit(table(["model", "audio", "wall s", "RTF", "peak RSS MB", "status"], rows))
        files = [self.long_file(1, rotate=r) for r in (0, 5, 10, 15)]
        rows = []
        texts = {}
        for workers in (1, 4):
            out = self.work / f"threads-{workers}.json"
            cmd = [sys.executable, str(RUNNERS), "whisperane-threads", str(out), *(str(f.path) for f in files),
                   "--model", str(self.bundle(model)), "--threads", str(args.threads), "--workers", str(workers)]
            lang = self.fixed_language(model)
            if lang:
                cmd += ["--language", lang]
            run = run_process(cmd)
            progress(f"threads {workers}: {run.wall:.1f} s, rc {run.returncode}")
            if run.returncode:
                rows.append([model, workers, "failed", "", "", run.stderr_tail])
                continue
            d = json.loads(out.read_text(encoding="utf-8"))
            texts[workers] = d["texts"]
            rows.append([model, workers, f"{run.wall:.1f}", f"{d['transcribe_wall_s']:.1f}", f"{run.peak_rss_mb:.0f}", ""])
        same = "yes" if len(texts) == 2 and texts[1] == texts[4] else "no"
        emit(f"\n4 different ~1-minute files ({sum(f.duration for f in files) / 60:.1f} min in all), one process, one "
             f"shared model: transcribed one after another (1 worker) and from 4 threads at once. "
             f"Threaded transcripts identical to the sequential ones: **{same}**.\n")
        emit(table(["model", "workers", "process wall s", "transcribe wall s", "peak RSS MB", "note"], rows))


def gap_check(t: Transcript, spans: Sequence[tuple[float, float]]) -> list[object]:
    """Words starting in the silence between clips; offsets of each clip's first word from the clip's start."""
    starts = np.asarray([w[1] for w in t.words])
    mids = np.asarray([(w[1] + w[2]) / 2 for w in t.words])
    in_gap = sum(int(np.sum((starts > e) & (starts < s2))) for (_, e), (s2, _) in zip(spans, spans[1:], strict=False))
    offsets = []
    for s1, e1 in spans:
        inside = np.nonzero((mids >= s1) & (mids <= e1))[0]
        if len(inside):
            offsets.append(abs(starts[inside[0]] - s1) * 1000)
    off = np.asarray(offsets) if offsets else np.zeros(1)
    return [len(starts), in_gap, f"{len(offsets)}/{len(spans)}", f"{np.median(off):.0f}", f"{off.max():.0f}",
            int(np.sum(off > 300))]


def long_segments_ok(t: Transcript) -> bool:
    """Words ordered and non-overlapping (a cheap long-form sanity check)."""
    ends = [(w[1], w[2]) for w in t.words]
    return all(s <= e + 1e-6 for s, e in ends) and all(a[1] <= b[0] + 1e-6 for a, b in zip(ends, ends[1:], strict=False))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma-separated model names (default: tiny.en,base; tiny.en with --quick)")
    p.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"), help="directory holding manifest.jsonl")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for every engine")
    p.add_argument("--repeats", type=int, default=3, help="runs per engine and file (median reported)")
    p.add_argument("--long-repeats", type=int, default=1,
                   help="runs of whisperane and faster-whisper int8 on the long file (others: 1)")
    p.add_argument("--long-engines", choices=["main", "all"], default="main",
                   help="main: whisperane and faster-whisper int8 on the long file (plus whisperane without word "
                   "timestamps for the first model); all: also faster-whisper float32 and int8 without word timestamps")
    p.add_argument("--long-minutes", type=float, default=10.0, help="length of the long English file")
    p.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "whisperane", "bench"),
                   help="where built audio files are kept")
    p.add_argument("--quick", action="store_true",
                   help="tiny.en only, long file: whisperane and faster-whisper int8 once, no 60-minute memory run")
    p.add_argument("--only", choices=SECTIONS, action="append", help="run only this section (repeatable)")
    args = p.parse_args(argv)
    if args.models is None:
        args.models = "tiny.en" if args.quick else "tiny.en,base"
    if not (Path(args.corpus) / "manifest.jsonl").is_file():
        p.error(f"{args.corpus}: no manifest.jsonl (pass --corpus)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the work directory is removed
    t0 = time.perf_counter()
    header(args)
    bench = Bench(args)
    try:
        for name in SECTIONS:
            if not args.only or name in args.only:
                getattr(bench, name)()
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)
    emit(f"\n_finished in {(time.perf_counter() - t0) / 60:.1f} min; load average at end: {loadavg()}_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
