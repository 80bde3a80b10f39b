#!/usr/bin/env bash
# Set up (see setup.sh), then run the demo: no API key needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PATH="$PWD/.venv/bin:$PATH" exec bash examples/demo.sh
