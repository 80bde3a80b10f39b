#!/usr/bin/env bash
# Two agents joined by &&, sharing one granted directory:
#   quinebox run "apply the patch" < fix.patch && quinebox run "run the tests"
# Usage: examples/pipelines/patch-then-test.sh PROJECT_DIR FIX.patch
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$1" && pwd)
cd "$project"
scripted() { [ -n "${OPENAI_API_KEY:-}" ] || echo "--model=script:$here/$1"; }
quinebox run -q -g "rw:$project" $(scripted apply-patch.yaml) "Apply the patch in the material to this project" < "$2" \
    && quinebox run -q -g "ro:$project" $(scripted run-tests.yaml) "Run this project's tests (sh test.sh) and report"
