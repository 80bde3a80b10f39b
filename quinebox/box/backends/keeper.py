"""What removes a quinebox process's runtime boxes when that process dies without removing them itself.

A box on an OCI runtime has no engine to remove it: its owner deletes it once it has exited. An owner killed by
SIGKILL cannot, so each owner starts one keeper, in a session of its own, the first time it starts such a box, and
tells it over a pipe which boxes it holds ("+ ID BUNDLE" before creating one, "- ID" once it is deleted). When
the pipe ends — the owner exited, however it died — the keeper kills and deletes whatever it still holds, removes
their bundles, and leaves. The box's lifeline would stop its processes too; the keeper also takes its cgroup
and runtime state.

Stdlib only, and no quinebox import: it starts in a few milliseconds, and keeps nothing of the owner's alive.
"""

import json
import shutil
import subprocess
import sys

DEADLINE = 10.0


def sweep(runtime: list, held: dict) -> None:
    for cid, bundle in held.items():
        for verb in (["kill", "--all", cid, "KILL"], ["delete", "--force", cid]):
            try:
                subprocess.run(runtime + verb, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=DEADLINE)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if bundle:
            shutil.rmtree(bundle, ignore_errors=True)


def main(argv: list) -> int:
    runtime = json.loads(argv[0])
    held = {}
    for line in sys.stdin.buffer:
        verb, _, rest = line.decode(errors="replace").rstrip("\n").partition(" ")
        cid, _, bundle = rest.partition(" ")
        if verb == "+" and cid:
            held[cid] = bundle
        elif verb == "-":
            held.pop(cid, None)
    sweep(runtime, held)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
