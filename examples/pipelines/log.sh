#!/usr/bin/env bash
# An agent as one stage of an ordinary pipeline:  cat log | quinebox run "…" | sort | uniq -c
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=(); [ -n "${OPENAI_API_KEY:-}" ] || model=(-m "script:$here/error-kinds.yaml")
printf '%s\n' "INFO boot" "ERROR disk" "ERROR net" "INFO ok" "ERROR disk" "ERROR auth" "ERROR disk" \
    | quinebox run -q "${model[@]}" "Print the kind of each ERROR line, one per line" | sort | uniq -c | sort -rn
