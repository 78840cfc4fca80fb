"""A decoding stopped where its text starts to loop (``DecodingOptions.stop_at_repetition``), measured two ways.

``agreement``: on the code of ``--root`` (a checkout that decodes every window to openai's end: d49f4c4 or older),
every decoding of the corpus's clips and the long English file of ``check_identical.py`` is looked at after the
fact: in which samples the stop would have come (a text token after which the text ends in a loop,
``repetition.loop_start``, and its compression ratio is over openai's threshold), and whether the early stop reaches
the fallback decision openai's whole decoding reached: a greedy decoding stopped in a loop fails as too repetitive;
at temperature > 0 a stopped sample ranks before the others (openai's ranking sees its whole loop), so the
temperature fails wherever a sample loops; "openai_chose_looping" says whether openai's own ranking chose a looping
sample where others did not loop. Printed: the decodings per kind and each one with a stop. (A window's later decodings follow from the
first decision, so each decoding is judged alone.)

    python benchmarks/bench_loop_stop.py agreement --root /tmp/old-checkout --model tiny.en [--batch-size 8]

``server``: ``whisperane serve`` (the code of ``--root``, one worker) asked for JFK with and without the issue's
degenerate prompt (``"word " * 224``), in interleaved pairs; each request's wall time and status, the medians
(min-max) and their ratio, and the load average before and after.

    python benchmarks/bench_loop_stop.py server --root . --pairs 3
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
from pathlib import Path

from runners import free_port, serving

REPO = Path(__file__).resolve().parent.parent
DEGENERATE_PROMPT = "word " * 224


def _inputs(corpus: Path, long_file: Path) -> list[tuple[str, Path]]:
    rows = [json.loads(line) for line in (corpus / "manifest.jsonl").read_text().splitlines() if line.strip()]
    return [(r["id"], corpus / r["audio"]) for r in rows] + [("long-en", long_file)]


def agreement(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(Path(args.root).resolve()))
    from whisperane import decoding
    from whisperane.decoding import compression_ratio
    from whisperane.loading import load_model
    from whisperane.longform import step
    from whisperane.options import TranscribeOptions
    from whisperane.repetition import loop_start

    model = load_model(str(Path(args.root) / "models" / args.model))
    options = TranscribeOptions()
    best_result = decoding._best_result  # the hook: every decoding's samples pass through it
    seen: list[dict] = []

    def judged(hypotheses, tokenizer, decoding_options, language_probs, no_speech_prob):
        result = best_result(hypotheses, tokenizer, decoding_options, language_probs, no_speech_prob)
        seen.append(_judge(hypotheses, result, tokenizer, options, loop_start, compression_ratio,
                           step._needs_fallback, decoding_options.temperature, args.clip))
        return result

    decoding._best_result = judged
    for clip_id, path in _inputs(Path(args.corpus), Path(args.long)):
        args.clip = clip_id
        model.transcribe(str(path), batch_size=args.batch_size)
    kinds: dict[str, int] = {}
    for row in seen:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    print(f"{args.model}{' batched ' + str(args.batch_size) if args.batch_size else ''}: {len(seen)} decodings")
    for kind, count in sorted(kinds.items()):
        print(f"  {kind:<40} {count}")
    mixed = [row for row in seen if row.get("mixed")]
    print(f"  samples above 0 where some loop and some not: {len(mixed)}, openai's ranking chose a looping one in "
          f"{sum(row['openai_chose_looping'] for row in mixed)}")
    for row in seen:
        if row["kind"] != "no loop":
            print(json.dumps(row, ensure_ascii=False))
    return 0


def _judge(hypotheses, result, tokenizer, options, loop_start, compression_ratio, needs_fallback, temperature,
           clip) -> dict:
    """One decoding: which samples would have stopped at a loop, and the fallback's decision both ways."""
    from dataclasses import replace

    tb, threshold = tokenizer.timestamp_begin, options.compression_ratio_threshold
    fired = []  # per sample: (how many tokens it decodes to the stop, where the cut is) or None
    for h in hypotheses:
        hit = next(((i, s) for i in range(1, len(h.tokens) + 1) if h.tokens[i - 1] < tokenizer.eot
                    and (s := loop_start(h.tokens[:i], tb)) is not None
                    and compression_ratio(tokenizer.decode(h.tokens[:i]).strip()) > threshold), None)
        fired.append(hit)
    row = {"clip": clip, "temperature": temperature, "samples": len(hypotheses),
           "looping": sum(f is not None for f in fired)}
    if not row["looping"]:
        return {**row, "kind": "no loop"}

    # the ranking: a stopped sample first (the best of them on all it decoded), else openai's (length_penalty None)
    scores = [(1, sum(h.token_logprobs[: f[0]]) / f[0]) if f else (0, h.sum_logprob / max(len(h.tokens), 1))
              for h, f in zip(hypotheses, fired, strict=True)]
    chosen = max(range(len(hypotheses)), key=lambda k: scores[k])
    openai_chose = next(k for k, h in enumerate(hypotheses) if list(h.tokens) == list(result.tokens))
    openai_fails = needs_fallback(result, options)
    if fired[chosen] is not None:  # looped: too repetitive, unless silence on all it decoded
        n = fired[chosen][0]
        kept = hypotheses[chosen].tokens[: fired[chosen][1]]
        avg = sum(hypotheses[chosen].token_logprobs[:n]) / (n + 1)
        stopped = replace(result, tokens=kept, text=tokenizer.decode(kept).strip(), avg_logprob=avg)
        early_fails = not (options.no_speech_threshold is not None and stopped.no_speech_prob > options.no_speech_threshold
                           and stopped.avg_logprob < options.logprob_threshold)
    else:
        h = hypotheses[chosen]
        text = tokenizer.decode(h.tokens).strip()
        stopped = replace(result, tokens=h.tokens, text=text, avg_logprob=h.sum_logprob / (len(h.tokens) + 1),
                          compression_ratio=compression_ratio(text))
        early_fails = needs_fallback(stopped, options)
    row["mixed"] = 0 < row["looping"] < len(hypotheses)  # looping samples beside others
    row["openai_chose_looping"] = fired[openai_chose] is not None
    same_result = list(stopped.tokens) == list(result.tokens)
    if openai_fails != early_fails:
        kind = "loop, other decision"
    elif not openai_fails and not same_result:
        kind = "loop, both keep, other text"
    else:
        kind = "loop, same decision" + (", fails" if openai_fails else ", keeps")
    return {**row, "kind": kind, "fired_at": [f and f[0] for f in fired], "openai_fails": openai_fails,
            "openai_cr": round(result.compression_ratio, 2), "openai_avg": round(result.avg_logprob, 3),
            "openai_len": len(result.tokens), "early_fails": early_fails, "early_text": stopped.text[:80],
            "openai_text": result.text[:80]}


def _serve(root: Path, model: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "whisperane", "serve", "--port", str(port), "--model", str(model),
                             "--max-concurrency", "1"], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    if serving(proc, url):
        return proc, url
    proc.kill()
    raise RuntimeError("the server did not start")


def _ask(url: str, audio: Path, prompt: str | None) -> tuple[float, int, str]:
    import httpx

    form = {"model": "whisper-1", "response_format": "json"}
    if prompt is not None:
        form["prompt"] = prompt
    t0 = time.perf_counter()
    with open(audio, "rb") as f:
        r = httpx.post(url + "/v1/audio/transcriptions", data=form, files={"file": (audio.name, f)}, timeout=600)
    wall = time.perf_counter() - t0
    text = r.json().get("text", "") if r.status_code == 200 else r.text
    return wall, r.status_code, text


def server(args: argparse.Namespace) -> int:
    root = Path(args.root).resolve()
    audio = REPO / "tests" / "data" / "jfk.flac"
    print(f"load average before: {open('/proc/loadavg').read().strip()}")
    proc, url = _serve(root, root / "models" / args.model)
    walls: dict[str, list[float]] = {"without": [], "with": []}
    try:
        _ask(url, audio, None)  # warm-up
        for i in range(args.pairs):
            order = ("without", "with") if i % 2 == 0 else ("with", "without")
            for which in order:
                wall, status, text = _ask(url, audio, DEGENERATE_PROMPT if which == "with" else None)
                walls[which].append(wall)
                print(f"pair {i + 1} {which:>7} prompt: {wall:6.2f} s  HTTP {status}  {text[:90]!r}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"load average after: {open('/proc/loadavg').read().strip()}")
    med = {k: statistics.median(v) for k, v in walls.items()}
    for k, v in walls.items():
        print(f"{k:>7} prompt: median {med[k]:.2f} s ({min(v):.2f}-{max(v):.2f})")
    ratios = [w / wo for w, wo in zip(walls["with"], walls["without"], strict=True)]
    print(f"ratio with/without: median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("agreement")
    a.add_argument("--root", required=True, help="a checkout that decodes every window to the end (d49f4c4)")
    a.add_argument("--model", default="tiny.en")
    a.add_argument("--batch-size", type=int, default=None)
    a.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    a.add_argument("--long", required=True, help="check_identical.py's long English file")
    s = sub.add_parser("server")
    s.add_argument("--root", default=str(REPO))
    s.add_argument("--model", default="tiny.en")
    s.add_argument("--pairs", type=int, default=3)
    args = p.parse_args()
    return agreement(args) if args.command == "agreement" else server(args)


if __name__ == "__main__":
    sys.exit(main())
