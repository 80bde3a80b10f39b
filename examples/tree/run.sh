#!/usr/bin/env bash
# Run the 36-session delegation tree offline and print it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
quinebox run -q --json -m "script:$here/root.yaml" -g spawn:35 -g depth:2 "Survey the ten regions" 2> "${TMPDIR:-/tmp}/quinebox-tree.json"
session=$(python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["session"])' "${TMPDIR:-/tmp}/quinebox-tree.json")
quinebox tree "$session"
