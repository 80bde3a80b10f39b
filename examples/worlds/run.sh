#!/usr/bin/env bash
# Worlds offline: rollback without amnesia, a fork from a recorded turn, and a race that adopts its winner's files.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
summary="${TMPDIR:-/tmp}/quinebox-worlds.json"
session_of() { python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["session"])' "$summary"; }

echo '$ quinebox run "Write calc.py, try an edit, undo it"'
quinebox run -q --json -m "script:$here/edit.yaml" "Write calc.py, try an edit, undo it" < /dev/null 2> "$summary"
session=$(session_of)
echo "\$ quinebox world log $session"
quinebox world log "$session"
echo "\$ quinebox world diff $session 2"
quinebox world diff "$session" 2
echo "\$ quinebox fork $session --at 2 --mission 'show calc.py'    # the world as turn 2 found it"
quinebox fork "$session" --at 2 --mission "show calc.py" -q -m "script:$here/show.yaml" < /dev/null
echo '$ quinebox run -g spawn:2 -g depth:1 "Get the report written"    # two children race; the winner is adopted'
quinebox run -q -m "script:$here/delegate.yaml" -g spawn:2 -g depth:1 "Get the report written" < /dev/null
