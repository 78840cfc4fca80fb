#!/usr/bin/env bash
# Create .venv with whisperane and its build + test dependencies. Idempotent: re-running is quick.
# torch is pinned and installed first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
stamp=".venv/.whisperane-setup-$(sha256sum pyproject.toml | cut -c1-16)"
if [ -f "$stamp" ]; then exit 0; fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[convert,test]"
rm -f .venv/.whisperane-setup-*
touch "$stamp"
