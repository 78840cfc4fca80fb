"""Screenshots of the page's states (``whisperane serve`` behind an API key, Debian's Chromium through Playwright).

Starts ``python -m whisperane serve`` on a free loopback port with tiny.en and base and ``--api-key``, then drives
the page at 1000x700 with a fake microphone playing JFK: the missing key, a file's text streaming, its segments,
a file that is not audio, two readers with speaker labels, the microphone's confirmed text and its end, base on
German. Writes one PNG per state to ``--out`` and prints what the page showed when (first text, done, Stop to
``done``) as JSON.

    python benchmarks/page_screenshots.py --out benchmarks/results/2026-12-06-session34-page
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from runners import free_port, serving

from whisperane.audio import load_audio

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
KEY = "screenshot-key"
LONG = ["1089-134686-0001.flac", "LJ001-0002.flac", "1089-134691-0001.flac", "LJ001-0008.flac",
        "1089-134691-0000.flac"] * 2 + ["jfk.flac"]
TALK = ["1089-134691-0001.flac", "LJ001-0002.flac", "1089-134686-0001.flac", "LJ001-0008.flac"]  # two readers
VIEWPORT = {"width": 1000, "height": 700}
STATE = "document.getElementById('transcript').dataset.state"


def joined(names: list[str], path: Path) -> Path:
    gap = np.zeros(16000, dtype=np.float32)
    parts = [part for n in names for part in (load_audio(str(DATA / n)), gap)][:-1]
    sf.write(str(path), np.concatenate(parts), 16000, subtype="PCM_16")
    return path


def serve(models: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = [sys.executable, "-m", "whisperane", "serve", "--port", str(port), "--api-key", KEY]
    for m in models:
        args += ["--model", m]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    if serving(proc, url):
        return proc, url
    proc.kill()
    raise SystemExit("whisperane serve did not start")


def shots(browser, url: str, out: Path, files: dict) -> dict:
    figures = {}
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(url + "/")
    page.wait_for_function("document.getElementById('key-error').textContent !== ''")
    page.set_input_files("#file", str(files["jfk"]))
    page.wait_for_function(f"{STATE} === 'error'")
    page.click("#mic-start")
    page.wait_for_function("document.getElementById('mic-status').classList.contains('error')")
    page.screenshot(path=str(out / "error-missing-key.png"))
    page.fill("#key", KEY)
    page.wait_for_function("document.querySelectorAll('#model option').length > 1")
    page.set_input_files("#file", str(files["long"]))
    started = time.monotonic()
    page.wait_for_function(f"{STATE} === 'streaming'", timeout=120_000)
    figures["long_file_first_text_s"] = round(time.monotonic() - started, 2)
    page.screenshot(path=str(out / "file-streaming.png"))
    page.wait_for_function(f"{STATE} === 'done'", timeout=120_000)
    figures["long_file_done_s"] = round(time.monotonic() - started, 2)
    page.locator("#transcript .word").nth(12).click()
    page.evaluate("document.getElementById('player').pause()")
    page.screenshot(path=str(out / "file-segments.png"))
    page.set_input_files("#file", str(files["not_audio"]))
    page.wait_for_function(f"{STATE} === 'error'", timeout=60_000)
    page.screenshot(path=str(out / "error-not-audio.png"))
    page.check("#speakers")
    page.set_input_files("#file", str(files["talk"]))
    page.wait_for_function(f"{STATE} === 'done'", timeout=120_000)
    page.screenshot(path=str(out / "file-speakers.png"))
    page.uncheck("#speakers")  # re-runs the conversation without labels
    page.wait_for_function(f"{STATE} === 'done'", timeout=120_000)
    figures.update(live(page, out))  # with tiny.en, before base: a model change re-runs the page's last file
    page.select_option("#model", "base")
    page.set_input_files("#file", str(files["german"]))
    page.wait_for_function(f"{STATE} === 'done'", timeout=120_000)
    page.screenshot(path=str(out / "file-base-german.png"))
    context.close()
    return figures


def live(page, out: Path) -> dict:
    page.click("#mic-start")
    page.wait_for_function("document.getElementById('confirmed').textContent.toLowerCase().includes('your country')",
                           timeout=120_000)
    page.screenshot(path=str(out / "live-confirmed.png"))
    page.evaluate("""() => {
        window.stopTimes = {};
        document.getElementById('mic-stop').addEventListener('click', () => { stopTimes.click = performance.now(); }, true);
        const status = document.getElementById('mic-status');
        new MutationObserver(() => { if (status.textContent === 'done') stopTimes.done ??= performance.now(); })
            .observe(status, { childList: true, characterData: true, subtree: true });
    }""")
    page.click("#mic-stop")
    page.wait_for_function("document.getElementById('mic-status').textContent === 'done'", timeout=120_000)
    page.screenshot(path=str(out / "live-done.png"))
    return {"live_stop_to_done_ms": round(page.evaluate("stopTimes.done - stopTimes.click"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=[str(REPO / "models" / "tiny.en"), str(REPO / "models" / "base")])
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (Debian: apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = {"jfk": DATA / "jfk.flac", "german": DATA / "test_de.wav", "long": joined(LONG, tmp / "long.wav"),
                 "mic": joined(["jfk.flac"], tmp / "mic.wav"), "not_audio": tmp / "notes.wav",
                 "talk": joined(TALK, tmp / "talk.wav")}
        files["not_audio"].write_text("not audio\n")
        proc, url = serve(args.models)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, headless=True, args=[
                    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                    f"--use-file-for-fake-audio-capture={files['mic']}"])
                figures = shots(browser, url, args.out, files)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
