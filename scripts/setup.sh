#!/usr/bin/env bash
# Create .venv with whisperane and its build + test dependencies. Idempotent: re-running is quick.
# torch is pinned and installed first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The stamp covers this script too, so a new step here runs on existing environments.
stamp=".venv/.whisperane-setup-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
# Bytecode for the package itself, on every run (quick when up to date): an editable install has none, and where
# PYTHONDONTWRITEBYTECODE is set (as on the CI machines) Python would compile every whisperane module at every start
# (JFK, whole process: 0.38 -> 0.25 s of imports). Stale bytecode is never used: Python checks the source's mtime.
compile_package() { .venv/bin/python -m compileall -q whisperane >/dev/null || true; }
# The server's page is tested in a real browser (tests/test_server_page.py): Debian's Chromium, installed where
# apt can (as root); elsewhere those tests skip, saying why.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || echo "setup: chromium not installed; the page tests will skip" >&2
fi
if [ -f "$stamp" ]; then compile_package; exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# The rest through uv (from PyPI): it downloads, installs and compiles the bytecode in parallel, 54 s against pip's
# 129 s on the 2-core CI machine, with the same versions; torch above stays pip's (uv does not read pip's
# find-links, where the CPU build lies). pip again if uv cannot run.
.venv/bin/python -m pip install -q uv \
  && .venv/bin/python -m uv pip install -q --python .venv/bin/python --compile-bytecode -e ".[convert,test]" \
  || .venv/bin/python -m pip install -q -e ".[convert,test]"
# openai-whisper is a test-only reference (tests/openai_reference.py). --no-deps: its declared dependencies pull
# triton, which the CPU never uses; what it needs at run time (tiktoken, numba, more-itertools) is in the test extra.
.venv/bin/python -m pip install -q --no-deps "openai-whisper==20250625"
.venv/bin/python -c "import whisper" # fail here, not in the tests, if the reference cannot load
rm -f .venv/.whisperane-setup-*
touch "$stamp"
compile_package
