#!/usr/bin/env bash
# A tour of `quinebox exec`: the five channels, a grant, and refused escapes.
# Needs only a Docker engine and the agent image (scripts/setup.sh makes both).
set -uo pipefail

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; }

step "1. argv, stdin, stdout, stderr and the exit status pass through"
show "printf 'hello from the host\n' | quinebox exec -- sh -c 'tr a-z A-Z; echo diagnostics >&2; exit 3'"
printf 'hello from the host\n' | quinebox exec -- sh -c 'tr a-z A-Z; echo "diagnostics on stderr" >&2; exit 3'
echo "exit status: $?"

step "2. Boxes compose like any filter"
show "seq 1 5 | quinebox exec -- awk '{s+=\$1} END {print s}' | quinebox exec -- sed 's/^/sum: /'"
seq 1 5 | quinebox exec -- awk '{s+=$1} END {print s}' | quinebox exec -- sed 's/^/sum: /'

step "3. A grant: this directory, read-only"
work=$(mktemp -d)
echo "a file the box may read" > "$work/notes.txt"
chmod 755 "$work"; chmod 644 "$work/notes.txt"
show "quinebox exec -g ro:$work -- sh -c 'cat $work/notes.txt; echo new > $work/x'"
quinebox exec -g "ro:$work" -- sh -c "cat $work/notes.txt; echo new > $work/x"
echo "exit status: $? (the write was refused by a read-only bind mount)"
rm -rf "$work"

step "4. What the box cannot do"
show "quinebox exec -- sh -c 'cat /proc/net/dev; touch /usr/bin/x; id -u'"
quinebox exec -- sh -c 'echo "network interfaces: $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " ")"; touch /usr/bin/x; echo "uid: $(id -u)"'
show "quinebox exec -- python3 -c 'unshare(0) via ctypes'"
quinebox exec -- python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); r = libc.unshare(0); print("unshare:", "allowed" if r == 0 else os.strerror(ctypes.get_errno()))'
show "quinebox exec --timeout 1 -- sleep 60"
quinebox exec --timeout 1 -- sleep 60
echo "exit status: $?"
show "quinebox exec --memory 64m -- python3 -c 'bytearray(512 << 20)'"
quinebox exec --memory 64m -- python3 -c 'bytearray(512 << 20)'
echo "exit status: $?"

step "5. Refused before anything starts"
show "quinebox exec -g rw:/var/run/docker.sock -- true"
quinebox exec -g rw:/var/run/docker.sock -- true
echo "exit status: $?"
show "quinebox exec -g ro:/ -- true"
quinebox exec -g ro:/ -- true
echo "exit status: $?"

step "6. Agents: argv is the mission, stdin the material, stdout the deliverable"
here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${OPENAI_API_KEY:-}" ]; then
    echo "(OPENAI_API_KEY is set: using the real model, ${QUINEBOX_MODEL:-the default})"
    count=(); errors=(); tally=()
else
    echo "(no OPENAI_API_KEY: using scripted models from examples/missions)"
    count=(-m "script:$here/missions/count-lines.yaml")
    errors=(-m "script:$here/missions/errors.yaml")
    tally=(-m "script:$here/missions/tally.yaml")
fi
show "seq 1 42 | quinebox run 'Count the lines of the material'"
seq 1 42 | quinebox run "${count[@]}" "Count the lines of the material"
echo "exit status: $?"
log=$'INFO start\nERROR disk full\nINFO retry\nERROR timeout\nERROR disk full\nINFO done'
show "printf '<a log>' | quinebox run -q 'Keep only the ERROR lines' | quinebox run -q 'Count each kind of line'"
printf '%s\n' "$log" | quinebox run -q "${errors[@]}" "Keep only the ERROR lines" | quinebox run -q "${tally[@]}" "Count each kind of line, most frequent first"
show "quinebox ls -n 3"
quinebox ls -n 3

step "7. Agents start agents, each child in its own box with at most its parent's grants"
show "quinebox run -g spawn:35 -g depth:2 'Survey the ten regions'    # a tree of 36 sessions"
bash "$here/tree/run.sh" | head -8
echo "…"

step "8. Worlds: files built for the task, revisions, rollback without amnesia"
bash "$here/worlds/run.sh"

step "9. Any image: this one has no Python and no libc, only a static busybox"
python "$here/images/busybox.py" quinebox-demo/busybox
show "echo 'any image' | quinebox exec --image quinebox-demo/busybox -- sh -c 'tr a-z A-Z; command -v python3 || echo no python3 here'"
echo 'any image' | quinebox exec --image quinebox-demo/busybox -- sh -c 'tr a-z A-Z; command -v python3 || echo "no python3 here"'
show "quinebox exec --image quinebox-demo/busybox -- ls /.quinebox    # what quinebox brings: its own loader, Python and guest"
quinebox exec --image quinebox-demo/busybox -- ls /.quinebox
show "seq 1 7 | quinebox run --image quinebox-demo/busybox 'Count the lines of the material'    # the agent's sh is busybox's"
seq 1 7 | quinebox run -q "${count[@]}" --image quinebox-demo/busybox "Count the lines of the material"
echo "exit status: $?"

step "10. Look instead of read: the same sessions as a web page"
view=$(mktemp -d)
show "quinebox view    # serves a live page on loopback and prints its URL; here, the static bundle CI keeps"
quinebox view --export "$view/view" 2>&1
echo "open $view/view/index.html in a browser: every session above, its tree, transcripts and world"

step "11. The command server: the first command above started it, and later ones went through it"
show "quinebox serve status"
quinebox serve status | head -1
show "quinebox serve stop    # or let it exit by itself after 15 minutes with no command"
quinebox serve stop

step "Nothing is left behind"
show "quinebox ps"
quinebox ps
