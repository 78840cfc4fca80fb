"""Every audio format read as a stream (issue 61): the server's refusal of a long upload, the samples and
transcripts of re-encoded corpus clips through each decoder, and the CLI's peak RSS on a 2-hour m4a.

Sections (all by default; --sections picks):
  refusal  `whisperane serve` at its defaults (60 minutes, 25 MB) given the issue's upload: 5 hours of quiet noise,
           Opus at 6 kbit/s in WebM (14 MB, made by PyAV: 10 s encoded, its packets repeated), posted --runs times:
           seconds to the 400 and the server's peak RSS growth (VmHWM, reset through /proc/PID/clear_refs before
           each post); the same audio without its length in the header (as a stream recorder writes it), counted;
           with --old-repo, the first file posted once to a server run from that checkout.
  samples  the corpus's English clips re-encoded by PyAV to m4a (AAC 64 kbit/s) and webm (Opus 32 kbit/s), read by
           PyAV (the default), the ffmpeg command (WHISPERANE_AUDIO_DECODER=ffmpeg) and the whole-file decode the
           project used before (ffmpeg to s16le, then float: what audio_files.ffmpeg_decode ran): lengths, largest
           difference and SNR against it; tiny.en's transcripts from each, identical or not, and WER.
  rss      `whisperane transcribe` (tiny.en) on a 10-minute m4a (corpus speech) and a 2-hour m4a (the same speech,
           then 110 minutes of digital silence, which the loop passes fast), --pairs interleaved pairs: peak RSS of
           each run (os.wait4 through runners.py) and wall time; with --old-repo, each once from that checkout.

    python benchmarks/bench_audio_stream.py --bundle models/tiny.en --old-repo /work/main
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]  # this checkout's whisperane first
from bench import Scorer, build_long_file, load_corpus, loadavg, run_process  # noqa: E402
from encoded import encode, noise_webm  # noqa: E402
from served import ServeProcess  # noqa: E402

from whisperane.audio import SAMPLE_RATE, load_audio  # noqa: E402
from whisperane.audio_decode import DECODER_VARIABLE  # noqa: E402

FORMATS = {"m4a": ("aac", "mp4", 64000), "webm": ("libopus", "webm", 32000)}


# --- refusal -------------------------------------------------------------------------------------------------------


def memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def post_once(server: ServeProcess, path: Path) -> dict:
    import httpx

    Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
    before = memory_kb(server.proc.pid, "VmRSS")
    started = time.monotonic()
    with path.open("rb") as f:
        r = httpx.post(server.url + "/v1/audio/transcriptions", files={"file": f}, timeout=600)
    seconds = time.monotonic() - started
    code = r.json().get("error", {}).get("code") if r.status_code != 200 else "ok"
    return {"status": r.status_code, "code": code, "seconds": seconds,
            "rss_growth_mb": (memory_kb(server.proc.pid, "VmHWM") - before) / 1024}


def serve(bundle: Path, repo: Path) -> ServeProcess:
    with contextlib.chdir(repo):  # `python -m whisperane` imports the package from the working directory
        return ServeProcess(["--model", str(bundle)])


def refusal(args, work: Path) -> dict:
    stated = noise_webm(work / "five_hours.webm", 5 * 3600)
    streamed = noise_webm(work / "five_hours_streamed.webm", 5 * 3600, seekable=False)
    out = {"file_mb": stated.stat().st_size / 2**20, "new": [], "new_streamed": [], "old": []}
    server = serve(args.bundle, ROOT)
    try:
        for _ in range(args.runs):
            out["new"].append(post_once(server, stated))
            out["new_streamed"].append(post_once(server, streamed))
    finally:
        server.stop()
    if args.old_repo:
        server = serve(args.bundle, args.old_repo)
        try:
            out["old"].append(post_once(server, stated))
        finally:
            server.stop()
    return out


# --- samples and transcripts ---------------------------------------------------------------------------------------


def old_decode(path: Path) -> np.ndarray:
    """The whole-file decode the project used before: ffmpeg's s16le on a pipe read whole, then float."""
    cmd = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "0", "-i", str(path), "-f", "s16le",
           "-ac", "1", "-acodec", "pcm_s16le", "-ar", str(SAMPLE_RATE), "-"]
    pcm = subprocess.run(cmd, capture_output=True, check=True).stdout
    return (np.frombuffer(pcm[: len(pcm) // 2 * 2], "<i2").astype(np.float32) / 32768.0).astype(np.float32)


@contextlib.contextmanager
def decoder(name: str | None):
    saved = os.environ.pop(DECODER_VARIABLE, None)
    if name:
        os.environ[DECODER_VARIABLE] = name
    try:
        yield
    finally:
        os.environ.pop(DECODER_VARIABLE, None)
        if saved is not None:
            os.environ[DECODER_VARIABLE] = saved


def reencoded(clips, work: Path) -> list[tuple[object, str, Path]]:
    """Each clip at its own rate and channels, encoded into each format."""
    import soundfile

    files = []
    for clip in clips:
        samples, rate = soundfile.read(str(clip.path), dtype="float32", always_2d=True)
        for ext, (codec, container, bit_rate) in FORMATS.items():
            rate_out = 48000 if codec == "libopus" and rate not in (8000, 12000, 16000, 24000, 48000) else rate
            if rate_out != rate:
                import soxr

                samples_out = soxr.resample(samples, rate, rate_out)
            else:
                samples_out = samples
            path = encode(work / f"{clip.id}.{ext}", samples_out[:, :2], rate_out, codec, container, bit_rate=bit_rate)
            files.append((clip, ext, path))
    return files


def samples_and_transcripts(args, work: Path) -> dict:
    from whisperane import load_model

    clips = [c for c in load_corpus(args.corpus) if c.language == "en"]
    files = reencoded(clips, work)
    model = load_model(args.bundle)
    scorer = Scorer()
    rows, totals = [], {}
    for clip, ext, path in files:
        old = old_decode(path)
        with decoder("av"):
            pyav = load_audio(path)
            r_av = model.transcribe(str(path))
        with decoder("ffmpeg"):
            piped = load_audio(path)
            r_ff = model.transcribe(str(path))
        r_old = model.transcribe(old)
        row = {"clip": clip.id, "format": ext, "n_old": len(old), "n_av": len(pyav), "n_ffmpeg": len(piped)}
        for name, x in (("av", pyav), ("ffmpeg", piped)):
            n = min(len(x), len(old))
            diff = x[:n] - old[:n]
            row[f"maxdiff_{name}"] = float(np.abs(diff).max())
            row[f"snr_{name}"] = float(10 * np.log10(np.sum(old[:n] ** 2) / max(np.sum(diff**2), 1e-30)))
        dumps = {k: json.dumps(asdict(r), sort_keys=True) for k, r in (("old", r_old), ("av", r_av), ("ffmpeg", r_ff))}
        row["json_identical_av"] = dumps["av"] == dumps["old"]
        row["json_identical_ffmpeg"] = dumps["ffmpeg"] == dumps["old"]
        for name, r in (("old", r_old), ("av", r_av), ("ffmpeg", r_ff)):
            errors, words = scorer.errors(clip.text, r.text, "en")
            key = (ext, name)
            e, w = totals.get(key, (0, 0))
            totals[key] = (e + errors, w + words)
        rows.append(row)
        print(json.dumps(row), flush=True)
    wer = {f"{ext} {name}": 100 * e / w for (ext, name), (e, w) in totals.items()}
    return {"rows": rows, "wer": wer, "clips": len(clips)}


# --- the CLI's peak RSS --------------------------------------------------------------------------------------------


def long_m4a_files(args, work: Path) -> dict[str, Path]:
    import soundfile

    clips = [c for c in load_corpus(args.corpus) if c.language == "en"]
    speech = build_long_file(clips, 600, work / "cache")
    ten = encode(work / "ten_minutes.m4a", soundfile.read(str(speech.path), dtype="float32", always_2d=True)[0],
                 SAMPLE_RATE, "aac", "mp4", bit_rate=32000)

    def blocks():
        yield soundfile.read(str(speech.path), dtype="float32", always_2d=True)[0]
        remaining = 7200 * SAMPLE_RATE - soundfile.info(str(speech.path)).frames
        while remaining > 0:
            yield np.zeros((min(remaining, 60 * SAMPLE_RATE), 1), np.float32)
            remaining -= 60 * SAMPLE_RATE

    two = encode(work / "two_hours.m4a", blocks(), SAMPLE_RATE, "aac", "mp4", bit_rate=32000)
    return {"10 min": ten, "2 h": two}


def cli(audio: Path, out: Path, bundle: Path, repo: Path | None = None) -> list[str]:
    head = [sys.executable, "-m", "whisperane"] if repo is None else [
        sys.executable, "-c", f"import sys; sys.path.insert(0, {str(repo)!r}); sys.argv[0] = 'whisperane'; "
        "from whisperane.command import entry; sys.exit(entry())"]
    return [*head, "transcribe", str(audio), "--model", str(bundle), "-o", str(out), "--output-format", "txt",
            "--overwrite"]


def rss(args, work: Path) -> dict:
    files = long_m4a_files(args, work)
    runs = {label: [] for label in files}
    for _ in range(args.pairs):
        for label, path in files.items():
            run = run_process(cli(path, work / "out", args.bundle))
            assert run.returncode == 0, run.stderr_tail
            runs[label].append({"peak_rss_mb": run.peak_rss_mb, "wall_s": run.wall})
            print(label, runs[label][-1], loadavg(), flush=True)
    old = {}
    if args.old_repo:
        for label, path in files.items():
            run = run_process(cli(path, work / "out-old", args.bundle, args.old_repo))
            old[label] = {"peak_rss_mb": run.peak_rss_mb, "wall_s": run.wall, "returncode": run.returncode}
            print("old", label, old[label], flush=True)
    return {"new": runs, "old": old, "seconds": {k: load_audio_length(p) for k, p in files.items()}}


def load_audio_length(path: Path) -> float:
    from whisperane.audio import open_audio

    with open_audio(path) as stream:
        return stream.duration


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=ROOT / "models" / "tiny.en")
    ap.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    ap.add_argument("--old-repo", type=Path, default=None, help="a checkout with the whole-file ffmpeg path")
    ap.add_argument("--sections", nargs="+", default=["refusal", "samples", "rss"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    args.bundle = args.bundle.resolve()
    figures = {"load_before": loadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        for section in args.sections:
            figures[section] = {"refusal": refusal, "samples": samples_and_transcripts, "rss": rss}[section](
                args, Path(tmp))
            figures[f"load_after_{section}"] = loadavg()
            print(section, json.dumps(summary(section, figures[section])), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def summary(section: str, f: dict) -> dict:
    """The medians and ranges a results file quotes."""
    def spread(values):
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    if section == "refusal":
        return {k: {"seconds": spread([r["seconds"] for r in v]), "rss_growth_mb": spread([r["rss_growth_mb"] for r in v]),
                    "codes": sorted({r["code"] for r in v})} for k, v in f.items() if isinstance(v, list) and v}
    if section == "samples":
        return {"wer": f["wer"], "json_identical_av": sum(r["json_identical_av"] for r in f["rows"]),
                "json_identical_ffmpeg": sum(r["json_identical_ffmpeg"] for r in f["rows"]), "files": len(f["rows"]),
                "min_snr_av": min(r["snr_av"] for r in f["rows"]), "min_snr_ffmpeg": min(r["snr_ffmpeg"] for r in f["rows"])}
    return {k: {"peak_rss_mb": spread([r["peak_rss_mb"] for r in v]), "wall_s": spread([r["wall_s"] for r in v])}
            for k, v in f["new"].items()} | {"old": f["old"]}


if __name__ == "__main__":
    sys.exit(main())
