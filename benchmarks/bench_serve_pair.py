"""``whisperane serve`` from two source trees, paired: the same requests against each, rounds interleaved.

Each round starts one server per tree in turn (A B, then B A, ...), each a fresh child process on a loopback port
(``python -m whisperane serve`` with the tree first on the path), and sends it one warm-up request, then
``--requests`` POSTs of one file from one client, then as many from each of two concurrent clients. Reported per
tree and level: the median over rounds (min-max) of throughput (requests per second) and of the median request
latency, the server's peak resident set (VmHWM, read before it stops), and the per-round ratio of the two trees'
throughputs; the load average before and after. ``--json FILE`` keeps the raw figures.

    python benchmarks/bench_serve_pair.py --tree before=/path/to/old/checkout --tree after=. --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``whisperane serve`` from ``tree`` on a free port, ready once /health answers."""

    def __init__(self, tree: Path, bundle: Path, workers: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "whisperane", "serve", "--port", str(self.port), "--model", str(bundle),
               "--max-concurrency", str(workers)]
        self.proc = subprocess.Popen(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the server from {tree} exited: {self.log.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server from {tree} did not start")
            time.sleep(0.1)

    def peak_mib(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(f.read().split("VmHWM:")[1].split()[0]) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def post(url: str, audio: bytes, name: str) -> float:
    """One transcription request; its latency in seconds."""
    start = time.perf_counter()
    r = httpx.post(url + "/v1/audio/transcriptions", files={"file": (name, audio)}, data={"model": "whisper-1"},
                   timeout=300)
    r.raise_for_status()
    return time.perf_counter() - start


def level(url: str, audio: bytes, name: str, clients: int, requests: int) -> dict:
    """``clients`` clients sending ``requests`` requests each, one after another."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda _: [post(url, audio, name) for _ in range(requests)], range(clients)))
    wall = time.perf_counter() - start
    latencies = [t for run in runs for t in run]
    return {"throughput": len(latencies) / wall, "p50": statistics.median(latencies)}


def one_round(trees: dict[str, Path], order: list[str], args, audio: bytes) -> dict:
    out = {}
    for name in order:
        server = Server(trees[name], args.bundle, args.workers)
        try:
            post(server.url, audio, args.audio.name)  # warm-up: first-call costs are not the steady state
            out[name] = {f"{c} client(s)": level(server.url, audio, args.audio.name, c, args.requests)
                         for c in (1, 2)}
            out[name]["peak_mib"] = server.peak_mib()
        finally:
            server.stop()
    return out


def spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(rounds: list[dict], names: list[str]) -> str:
    lines = ["| tree | clients | requests / s | p50 latency (s) | peak RSS (MiB) |", "|---|---|---|---|---|"]
    for name in names:
        for key in ("1 client(s)", "2 client(s)"):
            thr = [r[name][key]["throughput"] for r in rounds]
            p50 = [r[name][key]["p50"] for r in rounds]
            peak = spread([r[name]["peak_mib"] for r in rounds], 1) if key.startswith("1") else ""
            lines.append(f"| {name} | {key.split()[0]} | {spread(thr)} | {spread(p50, 3)} | {peak} |")
    a, b = names
    for key in ("1 client(s)", "2 client(s)"):
        ratios = [r[a][key]["throughput"] / r[b][key]["throughput"] for r in rounds]
        lines.append(f"\nthroughput {a} / {b}, {key}: {spread(ratios, 3)} (per round: "
                     + ", ".join(f"{x:.3f}" for x in ratios) + ")")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (twice)")
    ap.add_argument("--bundle", type=Path, default=REPO / "models" / "tiny.en")
    ap.add_argument("--audio", type=Path, default=REPO / "tests" / "data" / "jfk.flac")
    ap.add_argument("--requests", type=int, default=8, help="requests per client and level")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {n: Path(p).resolve() for n, _, p in (t.partition("=") for t in args.tree)}
    if len(trees) != 2:
        ap.error("give two trees")
    args.bundle = args.bundle.resolve()
    audio = args.audio.read_bytes()
    names = list(trees)
    print(f"load average before: {os.getloadavg()}", flush=True)
    rounds = []
    for i in range(args.rounds):
        rounds.append(one_round(trees, names if i % 2 == 0 else names[::-1], args, audio))
        print(f"round {i + 1}: {json.dumps(rounds[-1])} load {os.getloadavg()}", flush=True)
    print(f"load average after: {os.getloadavg()}\n")
    print(report(rounds, names))
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
