"""A soak of ``whisperane serve``: mixed traffic with bad clients at the default capacity, against the same good
traffic without them.

Two phases, each on a fresh server process (``python -m whisperane serve --model M --port P`` plus any
``--server-arg``; the default capacity: one decode per core, 16 queued):

- baseline (``--baseline-minutes``, 3): the good traffic only: ``--normal-clients`` clients sending short clips
  one after another (json without words, verbose_json with words, srt, in turn; every answer must be 200),
  ``--sse-clients`` streaming a 20-30 s file with ``stream=true`` to its done event (every ``--sse-abort-every``-th
  left after its first delta), ``--ws-clients`` sending JFK as 16 kHz PCM in 0.5 s frames at ``--ws-speed`` x
  real time over the live WebSocket;
- soak (``--soak-minutes``, 10): the same, plus ``--bad-clients`` (at most 8) cycling through the bad kinds of
  ``soak_clients.BAD_KINDS``: aborted uploads, slow and short uploads, half a request line, idle and malformed
  WebSockets, a foreign Origin or Host, beam_size 1000, a WAV of 1e19 samples.

The server's RSS (itself and its children) and /health's admitted count are sampled once a second, its CPU
time is read at the phase's start and end. When a phase ends its traffic stops, /health's admitted must fall
to 0 within 60 s (else a slot leaked), and one JFK transcription must come back right. The issue's verdicts:
no slot leaked, no 5xx from any client, RSS flat (the maximum after the warm-up, the first minute or the first
half of a shorter phase, within 10 % of the warm-up's maximum), and the normal requests' p95 latency in the soak
at most 1.5 x the baseline's; beside them every normal request 200, no client thread stuck past the phase, the
server alive, JFK right. Shown but not judged: the RSS trend (MB/min, least squares after the warm-up) and how
many bad clients got the answer the spec gives them within its timeout + 5 s. The good traffic's defaults keep
the server at about half of 2 cores (normal ~20 %, SSE ~10 %, WS ~20 % of its CPU time). The p95s are taken on
a machine shared with other work: compare them within one run, with the load averages printed beside them.

Exit status 0 when every verdict holds, 1 when one fails, 2 when the server does not start (an older server
that rejects a ``--server-arg`` flag is named in one line), 3 when the watchdog ends a run that outlived every
bound (it should not: every wait has its own).

Markdown on stdout, progress on stderr, raw figures with ``--json FILE``. ``--smoke``: 0.5 + 1 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import soundfile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Clip, build_long_file, load_corpus, read_16k_mono  # noqa: E402
from bench_server import CORPUS, PYTHON, REPO, ServerProcess, child_pids, free_port, load, settled  # noqa: E402
from soak_clients import (  # noqa: E402
    BAD_KINDS,
    FORMATS,
    MAX_BAD,
    PATH,
    Audio,
    Limits,
    Traffic,
    bad_client,
    float_wav,
    normal_client,
    sse_client,
    ws_client,
)
from soak_report import report, summarise, verdicts  # noqa: E402

JFK = REPO / "tests" / "data" / "jfk.flac"
JFK_TEXT = "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country."
DRAIN_S = 60.0  # how long admitted may take to fall to 0 once the traffic stopped: longer is a leaked slot
JOIN_S = 150.0  # past the longest single client operation (a normal request's 120 s read timeout)
SERVERS: list[ServerProcess] = []  # the live one, for the watchdog


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^a-z ]", " ", text.lower()).split())


def load_audio(corpus: Path, work: Path) -> tuple[Audio, dict]:
    """The clips (English, 2-12 s; the corpus's, else tests/data's), the SSE file built from them, JFK's PCM."""
    if (corpus / "manifest.jsonl").is_file():
        clips = [c for c in load_corpus(corpus) if c.language == "en" and 2 <= c.duration <= 12]
    else:
        clips = [Clip(p.stem, p, "", "en", soundfile.info(str(p)).duration)
                 for p in sorted((REPO / "tests" / "data").glob("*.flac"))]
    long_file = build_long_file(clips, 20, work)  # clips are added whole until >= 20 s: 20-30 s with these
    pcm = (np.clip(read_16k_mono(JFK), -1, 1 - 2**-15) * 32768).astype("<i2").tobytes()
    audio = Audio([(c.path.name, c.path.read_bytes()) for c in clips], long_file.path.read_bytes(), pcm,
                  float_wav(1e19))
    about = {"clips": len(clips), "clip_seconds": round(sum(c.duration for c in clips), 1),
             "source": str(corpus) if (corpus / "manifest.jsonl").is_file() else "tests/data",
             "sse_file_seconds": round(long_file.duration, 1)}
    return audio, about


def expected_limits(server_args: list[str]) -> Limits:
    """The timeouts the bad clients' hold times are judged by: those passed to the server, else the defaults."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--header-timeout", type=float, default=Limits.header_timeout)
    p.add_argument("--idle-timeout", type=float, default=Limits.idle_timeout)
    known, _ = p.parse_known_args(server_args)
    return Limits(known.header_timeout, known.idle_timeout)


def start_server(args: argparse.Namespace) -> ServerProcess:
    """The server, or exit 2 with one line naming what went wrong (an unknown flag: an older server)."""
    port = args.port or free_port()
    model = str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
    cmd = [PYTHON, "-m", "whisperane", "serve", "--model", model, "--port", str(port), *args.server_args]
    try:
        server = ServerProcess("whisperane", cmd, port, env={"PYTHONPATH": str(REPO)})
    except RuntimeError as e:
        lines = [x.strip() for x in str(e).splitlines() if "error:" in x] or [str(e).splitlines()[-1]]
        unknown = "unrecognized arguments" in lines[-1]
        hint = " (a flag this server does not know: an older server, or a typo)" if unknown else ""
        print(f"bench_soak: the server did not start: {lines[-1]}{hint}", file=sys.stderr)
        sys.exit(2)
    SERVERS.append(server)
    return server


def transcribe_jfk(server: ServerProcess) -> dict:
    """One real transcription of JFK; right when its words are the reference's (punctuation and case aside)."""
    t0 = time.monotonic()
    try:
        r = httpx.post(server.url + PATH, files={"file": (JFK.name, JFK.read_bytes())},
                       data={"model": "whisper-1"}, timeout=httpx.Timeout(60, connect=10))
        text = r.json().get("text", "") if r.status_code == 200 else r.text[:200]
        status = r.status_code
    except (httpx.HTTPError, ValueError) as e:
        text, status = type(e).__name__, None
    return {"status": status, "text": text, "right": status == 200 and normalized(text) == normalized(JFK_TEXT),
            "seconds": round(time.monotonic() - t0, 2)}


def warm_up(server: ServerProcess, audio: Audio) -> dict:
    """JFK, then a clip in each normal format: first requests pay for warming up paths (word timing's among
    them), which is no normal request's latency."""
    jfk = transcribe_jfk(server)
    for _, fields in FORMATS:
        try:
            httpx.post(server.url + PATH, files={"file": audio.clips[0]}, data={"model": "whisper-1", **fields},
                       timeout=httpx.Timeout(60, connect=10))
        except httpx.HTTPError:
            pass  # the soak's own requests will show what is wrong
    return jfk


def cpu_seconds(pid: int) -> float:
    """User + system seconds of the process and its live children."""
    total = 0.0
    for p in [pid, *child_pids(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


class Sampler(threading.Thread):
    """Once a second: the server's RSS and /health's admitted count, until ``stop`` is set."""

    def __init__(self, server: ServerProcess, stop: threading.Event):
        super().__init__(daemon=True)
        self.server, self.stop, self.t0 = server, stop, time.monotonic()
        self.rss: list[tuple[float, float]] = []
        self.admitted: list[int] = []
        self.health_failures = 0

    def run(self) -> None:
        with httpx.Client(timeout=2) as client:
            for _ in range(10**6):  # a phase lasts far fewer seconds; the stop flag ends it
                if self.stop.wait(1.0):
                    return
                self.rss.append((time.monotonic() - self.t0, self.server.rss_mb()))
                try:
                    self.admitted.append(client.get(self.server.url + "/health").json()["admitted"])
                except (httpx.HTTPError, ValueError, KeyError):
                    self.health_failures += 1


def start_clients(traffic: Traffic, audio: Audio, args: argparse.Namespace, bad: bool) -> list[threading.Thread]:
    plan = [(normal_client, (k, args.think)) for k in range(args.normal_clients)]
    plan += [(sse_client, (args.sse_abort_every, args.sse_pause))] * args.sse_clients
    plan += [(ws_client, (args.ws_speed, args.ws_pause))] * args.ws_clients
    if bad:
        n = min(args.bad_clients, MAX_BAD)
        plan += [(bad_client, (k, n, args.bad_pause, args.bad_kinds)) for k in range(n)]
    threads = [threading.Thread(target=fn, args=(traffic, audio, *rest), daemon=True, name=f"{fn.__name__}-{i}")
               for i, (fn, rest) in enumerate(plan)]
    for t in threads:
        t.start()
    return threads


def run_phase(name: str, minutes: float, bad: bool, args: argparse.Namespace, audio: Audio) -> dict:
    server = start_server(args)
    try:
        warm = warm_up(server, audio)
        traffic = Traffic(server.port, minutes * 60, args.limits)
        sampler = Sampler(server, traffic.stop)
        cpu0, t0 = cpu_seconds(server.proc.pid), time.monotonic()
        sampler.start()
        threads = start_clients(traffic, audio, args, bad)
        for m in range(int(minutes) + 2):  # a progress line a minute, on stderr
            if traffic.stop.wait(max(0.0, min(60.0, traffic.t0 + traffic.seconds - time.monotonic()))) or \
                    time.monotonic() >= traffic.t0 + traffic.seconds:
                break
            progress(name, m + 1, traffic, sampler)
        traffic.stop.set()
        busy = (cpu_seconds(server.proc.pid) - cpu0) / ((time.monotonic() - t0) * (os.cpu_count() or 1))
        deadline = time.monotonic() + JOIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        drain = drain_slots(server)
        after = transcribe_jfk(server)
    finally:
        died = server.proc.poll()  # an exit status here: the server died during the phase
        stop_s, log = stop_server(server)
    return {"name": name, "minutes": minutes, "bad": bad, "warm_up": warm, "records": traffic.records,
            "rss": sampler.rss, "admitted_peak": max(sampler.admitted, default=None),
            "health_failures": sampler.health_failures, "busy": round(busy, 3), "stuck": stuck, "drain": drain,
            "after": after, "stop_seconds": stop_s, "log_errors": log, "died": died}


def progress(name: str, minute: int, traffic: Traffic, sampler: Sampler) -> None:
    normal = [r for r in list(traffic.records) if r["kind"] == "normal"]
    other = Counter(r["answer"] for r in normal if r["answer"] != "200")
    rss = max((mb for _, mb in sampler.rss[-60:]), default=0.0)
    print(f"{name} minute {minute}: {len(normal)} normal requests, non-200 {dict(other)}, {len(traffic.records)} "
          f"records, admitted now {sampler.admitted[-1] if sampler.admitted else '?'}, RSS {rss:.0f} MB",
          file=sys.stderr, flush=True)


def drain_slots(server: ServerProcess) -> dict:
    """Waits (bounded) for /health's admitted to reach 0; what it showed at the end, and how long it took."""
    t0 = time.monotonic()
    try:
        settled(server, DRAIN_S)
        health = httpx.get(server.url + "/health", timeout=5).json()
    except (httpx.HTTPError, ValueError) as e:
        health = {"error": type(e).__name__}
    return {"health": health, "seconds": round(time.monotonic() - t0, 1), "leak": health.get("admitted") != 0}


def stop_server(server: ServerProcess) -> tuple[float, dict]:
    """Stops it (SIGTERM, SIGKILL after 60 s); how long that took and what its log says went wrong."""
    t0 = time.monotonic()
    server.stop()
    SERVERS.remove(server)
    server.log.seek(0)
    text = server.log.read().decode(errors="replace")
    first = text[text.find("Traceback"):].splitlines() if "Traceback" in text else []
    # a traceback's exception is its first line after the indented frames
    exception = next((x for x in first[1:] if not x.startswith(" ")), "")
    errors = sum(" 500 " in x or "ERROR" in x for x in text.splitlines())
    return round(time.monotonic() - t0, 1), {"tracebacks": text.count("Traceback"), "first_exception": exception,
                                             "error_lines": errors, "first_traceback": "\n".join(first[:40])}


# --- the run ------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-minutes", type=float, default=3.0)
    ap.add_argument("--soak-minutes", type=float, default=10.0)
    ap.add_argument("--smoke", action="store_true", help="a 0.5-minute baseline and a 1-minute soak")
    ap.add_argument("--model", default="models/tiny.en", help="model name or bundle directory")
    ap.add_argument("--port", type=int, default=None, help="the server's port (default: a free one per phase)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARGS",
                    help="flags for whisperane serve, split like a shell: --server-arg='--idle-timeout 15'; "
                         "repeatable. --header-timeout / --idle-timeout also set the holds the bad clients expect")
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="clips (manifest.jsonl); tests/data when absent")
    ap.add_argument("--normal-clients", type=int, default=2)
    # the pauses keep the good traffic at about half of 2 cores (server CPU): normal ~20 %, SSE ~10 %, WS ~20 %
    ap.add_argument("--think", type=float, default=1.5, help="seconds a normal client waits between requests")
    ap.add_argument("--sse-clients", type=int, default=1)
    ap.add_argument("--sse-pause", type=float, default=3.0, help="seconds an SSE client waits between streams")
    ap.add_argument("--sse-abort-every", type=int, default=3, help="every Nth stream left after its first delta")
    ap.add_argument("--ws-clients", type=int, default=1)
    ap.add_argument("--ws-speed", type=float, default=3.0, help="live audio sent at this many times real time")
    ap.add_argument("--ws-pause", type=float, default=15.0, help="seconds a WS client waits between streams")
    ap.add_argument("--bad-clients", type=int, default=5, help=f"bad clients at once in the soak (at most {MAX_BAD})")
    ap.add_argument("--bad-pause", type=float, default=1.0, help="seconds each bad client waits between tries")
    ap.add_argument("--bad-kinds", default=",".join(BAD_KINDS), help="a comma-separated subset (to find which "
                    "kind a failure comes from); default: all of them")
    ap.add_argument("--json", type=Path, help="write the raw figures (every record) here")
    args = ap.parse_args()
    if args.smoke:
        args.baseline_minutes, args.soak_minutes = 0.5, 1.0
    args.server_args = [a for value in args.server_arg for a in shlex.split(value)]
    args.bad_kinds = [k.strip() for k in args.bad_kinds.split(",") if k.strip()]
    if not args.bad_kinds or set(args.bad_kinds) - set(BAD_KINDS):
        ap.error(f"--bad-kinds: from {', '.join(BAD_KINDS)}")
    args.limits = expected_limits(args.server_args)
    return args


def watchdog(seconds: float) -> threading.Timer:
    """The last resort if a bound was missed: stop the server and leave, rather than hang."""
    def fire() -> None:
        print(f"bench_soak: watchdog: still running after {seconds:.0f} s; stopping", file=sys.stderr, flush=True)
        for server in list(SERVERS):
            server.proc.kill()
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []
    return {"cpu": next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), "unknown"),
            "cores": os.cpu_count(), "load_before": load()}


def main() -> int:
    args = parse_args()
    # per phase: the server's start (<= 300 s), the joins, the drain, two JFK requests and the stop, with room
    timer = watchdog((args.baseline_minutes + args.soak_minutes) * 60 + 2 * (300 + JOIN_S + DRAIN_S + 300))
    about = machine()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as work:
        audio, about["audio"] = load_audio(args.corpus, Path(work))
        phases = {}
        for name, minutes, bad in (("baseline", args.baseline_minutes, False), ("soak", args.soak_minutes, True)):
            if minutes > 0:
                print(f"{name}: {minutes:g} min, load {load()}",
                      file=sys.stderr, flush=True)
                phases[name] = run_phase(name, minutes, bad, args, audio)
    about["load_after"] = load()
    sums = {n: summarise(p) for n, p in phases.items()}
    passed = report(phases, sums, about, args)
    if args.json:
        args.json.write_text(json.dumps({"machine": about, "args": {k: str(v) for k, v in vars(args).items()},
                                         "phases": phases, "summaries": sums, "verdicts": verdicts(phases, sums)},
                                        indent=1, default=str))
    timer.cancel()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
