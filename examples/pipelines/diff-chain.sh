#!/usr/bin/env bash
# Three agents in a chain over `git diff`: what changed → how risky → a report.
# Run it inside a git repository with a change: examples/pipelines/diff-chain.sh [BASE]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
scripted() { [ -n "${OPENAI_API_KEY:-}" ] || echo "--model=script:$here/$1"; }
git diff "${1:-HEAD}" \
    | quinebox run -q $(scripted summarize-diff.yaml) "List the files this diff changes, one 'changed: PATH' per line" \
    | quinebox run -q $(scripted assess.yaml) "For each changed file, say whether it needs review" \
    | quinebox run -q $(scripted report.yaml) "Write a short Markdown report of these notes"
