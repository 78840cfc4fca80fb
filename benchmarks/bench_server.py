"""``whisperane serve`` against faster-whisper-server, side by side in one run, through the official openai client.

Both servers run as child processes on loopback ports for the whole run, on the same tiny.en weights
(whisperane's converted bundle of the CTranslate2 int8 checkpoint; faster-whisper-server loads that checkpoint,
int8, on the CPU), both decoding greedily with the temperature fallback:

- throughput (audio seconds per wall second) and p50 / p95 request latency at 1, 2, 4 and 8 concurrent clients,
  each client sending corpus clips one after another (the English clips of /work/shared/corpus, in turn);
  rounds interleave the servers (A B, then B A, ...) and the report gives medians over rounds with the spread;
- one long file (``--long-minutes``, built from the corpus clips) per server and round, at one client;
- time to the first streamed delta (``stream=true``) on the long file (faster-whisper-server does not stream);
- peak RSS of each server process while the 8-client level runs (/proc/PID/status VmRSS, sampled);
- optionally (``--ray``) the same clients against ``whisperane serve --ray-address local --replicas 2``.

faster-whisper-server (PyPI 0.0.3) lives in its own venv (``--fws-venv``, default /work/team/fws-venv), never in
the package's. Prints a markdown report and the load average before and after; ``--json FILE`` keeps the raw
figures. ``--smoke``: one round, 1 and 2 clients, few requests, a 1-minute long file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import build_long_file, load_corpus  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
PYTHON = sys.executable


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server child process; ``url`` once /health answers."""

    def __init__(self, name: str, cmd: list[str], port: int, env: dict | None = None, extra_body: dict | None = None):
        self.name, self.port, self.extra_body = name, port, extra_body or {}
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=self.log, stderr=self.log,
                                     cwd=REPO)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{name} exited: {self.log.read().decode(errors='replace')[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{name} did not start")
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="bench", max_retries=0, timeout=3600)

    def rss_mb(self) -> float:
        """The resident set of the server and its children (Ray replicas are elsewhere: not counted)."""
        total = 0.0
        for pid in [self.proc.pid, *child_pids(self.proc.pid)]:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024
            except OSError:
                pass
        return total

    def transcribe(self, path: Path) -> str:
        with path.open("rb") as f:
            return self.client.audio.transcriptions.create(model="whisper-1", file=f, extra_body=self.extra_body).text

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def child_pids(pid: int) -> list[int]:
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [k for c in kids for k in child_pids(c)]


def whisperane_server(bundle: Path, workers: int, threads: int = 1) -> ServerProcess:
    port = free_port()
    cmd = [PYTHON, "-m", "whisperane", "serve", "--model", str(bundle), "--port", str(port),
           "--max-concurrency", str(workers), "--threads-per-worker", str(threads), "--max-queue", "64"]
    name = "whisperane" if threads == 1 else f"whisperane {workers} worker(s) x {threads} threads"
    return ServerProcess(name, cmd, port, env={"PYTHONPATH": str(REPO)}, extra_body={"word_timestamps": "false"})


def fws_server(venv: Path, checkpoint: Path, threads: int, workdir: Path) -> ServerProcess:
    port = free_port()
    config = workdir / "fws.yaml"
    config.write_text(json.dumps({"batch_size": 1, "models": [{
        "name": "whisper-1", "path": str(checkpoint),
        "model_options": {"device": "cpu", "compute_type": "int8", "cpu_threads": threads},
        "transcribe_options": {"beam_size": 1}}]}))
    cmd = [str(venv / "bin" / "faster-whisper-server"), "--config", str(config), "--host", "127.0.0.1",
           "--port", str(port)]
    return ServerProcess("faster-whisper-server", cmd, port)


def ray_server(bundle: Path) -> ServerProcess:
    port = free_port()
    cmd = [PYTHON, "-m", "whisperane", "serve", "--model", str(bundle), "--port", str(port), "--ray-address", "local",
           "--replicas", "2", "--max-concurrency", "1"]
    return ServerProcess("whisperane on Ray Serve (2 replicas)", cmd, port, env={"PYTHONPATH": str(REPO)},
                         extra_body={"word_timestamps": "false"})


def run_level(server: ServerProcess, clips: list, clients: int, requests: int, sample_rss: bool) -> dict:
    """``requests`` clips sent by ``clients`` threads, each request after the previous one of its client."""
    jobs = [clips[i % len(clips)] for i in range(requests)]
    latencies: list[float] = []
    peak = [server.rss_mb()]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.05):
            peak[0] = max(peak[0], server.rss_mb())

    def client(k: int):
        for clip in jobs[k::clients]:
            t0 = time.perf_counter()
            server.transcribe(clip.path)
            latencies.append(time.perf_counter() - t0)

    sampler = threading.Thread(target=sample, daemon=True)
    if sample_rss:
        sampler.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - t0
    stop.set()
    latencies.sort()
    return {"throughput": sum(c.duration for c in jobs) / wall, "p50": _quantile(latencies, 0.5),
            "p95": _quantile(latencies, 0.95), "wall": wall, "peak_rss_mb": peak[0] if sample_rss else None}


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 else values[0]


def first_delta(server: ServerProcess, path: Path) -> float:
    """Seconds from the request's start to its first streamed delta. The stream is left there; the server stops
    its decode at the next window, and the next measurement starts once it has (``settled``)."""
    t0 = time.perf_counter()
    with path.open("rb") as f, httpx.stream("POST", server.url + "/v1/audio/transcriptions", timeout=3600,
                                            files={"file": f, "stream": (None, "true")}) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("type") == "transcript.text.delta":
                seconds = time.perf_counter() - t0
                break
        else:
            raise RuntimeError("no delta")
    settled(server)
    return seconds


def settled(server: ServerProcess, timeout: float = 120.0) -> None:
    """Returns once whisperane's /health admits no request (the left stream's decode has stopped)."""
    deadline = time.monotonic() + timeout
    while httpx.get(server.url + "/health", timeout=5).json().get("admitted", 0) and time.monotonic() < deadline:
        time.sleep(0.1)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=REPO / "models" / "tiny.en")
    ap.add_argument("--fws-venv", type=Path, default=Path("/work/team/fws-venv"))
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per level")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--long-minutes", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="whisperane's decode workers")
    ap.add_argument("--ray", action="store_true", help="also whisperane on Ray Serve, 2 local replicas")
    ap.add_argument("--one-worker", action="store_true", help="also whisperane with 1 worker of --workers threads")
    ap.add_argument("--no-long-throughput", action="store_true",
                    help="skip the long file's whole transcription (its first streamed delta is still measured)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.smoke:
        args.clients, args.requests, args.rounds, args.long_minutes = "1,2", 4, 1, 1.0
    from whisperane.convert.sources import resolve_source

    levels = [int(c) for c in args.clients.split(",")]
    clips = [c for c in load_corpus(CORPUS) if c.language == "en"]
    work = Path(tempfile.mkdtemp(prefix="bench-server-"))
    long_file = build_long_file(clips, args.long_minutes * 60, work)
    checkpoint = resolve_source("tiny.en", progress=False).path
    print(f"load before: {load()}", flush=True)
    servers = [whisperane_server(args.bundle, args.workers), fws_server(args.fws_venv, checkpoint, args.workers, work)]
    if args.one_worker:
        servers.append(whisperane_server(args.bundle, 1, args.workers))
    if args.ray:
        servers.append(ray_server(args.bundle))
    figures: dict = {s.name: {"levels": {c: [] for c in levels}, "long": [], "first_delta": []} for s in servers}
    try:
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            for server in order:
                for c in levels:
                    figures[server.name]["levels"][c].append(run_level(server, clips, c, args.requests, c == max(levels)))
                    print(server.name, r, c, figures[server.name]["levels"][c][-1], flush=True)
                if not args.no_long_throughput:
                    t0 = time.perf_counter()
                    server.transcribe(long_file.path)
                    figures[server.name]["long"].append(long_file.duration / (time.perf_counter() - t0))
                if server.name.startswith("whisperane"):
                    figures[server.name]["first_delta"].append(first_delta(server, long_file.path))
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load after: {load()}")
    report(figures, levels, long_file.duration, args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def report(figures: dict, levels: list[int], long_s: float, args) -> None:
    print(f"\n{args.rounds} round(s), {args.requests} requests per level; median (min-max) over rounds\n")
    print("| server | clients | throughput (audio s / s) | p50 latency (s) | p95 latency (s) | peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for name, f in figures.items():
        for c in levels:
            runs = f["levels"][c]
            rss = [x["peak_rss_mb"] for x in runs if x["peak_rss_mb"] is not None]
            print(f"| {name} | {c} | {spread([x['throughput'] for x in runs])} | {spread([x['p50'] for x in runs])} | "
                  f"{spread([x['p95'] for x in runs])} | {spread(rss) if rss else ''} |")
    print(f"\nlong file ({long_s:.0f} s), one client: throughput (audio s / s); time to first streamed delta (s)\n")
    for name, f in figures.items():
        delta = spread(f["first_delta"]) if f["first_delta"] else "no streaming"
        print(f"- {name}: {spread(f['long']) if f['long'] else 'not measured'}; first delta {delta}")


if __name__ == "__main__":
    sys.exit(main())
