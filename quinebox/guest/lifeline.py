"""The first process quinebox runs in every box: it ties the box's life to the host's.

It connects to the host's socket, then runs the command with the box's own
stdin, stdout and stderr. If that connection breaks — the host process died,
even by SIGKILL — it kills every process in the box and exits, so the box
stops and the engine removes it. Otherwise it exits with the command's status,
mapped as a shell would (126 not executable, 127 not found, 128+n signal n).

A warm box (`--pool`, box/pool/) starts the same init before it has a
command: it connects, then waits on the lifeline for its claim — the argv and
environment a cold box would have been created with, and on an OCI runtime the
claimer's own stdin, stdout and stderr — and runs that as above; on the engine
an agent's loop takes the process over instead, lifeline and all.

While the command runs, the host may ask the init over the lifeline to start
more commands beside it (execs.py): the fast way into a long-lived box.

This script is only the way in: its code is init.py's, imported from its compiled bytecode, since Python compiles
the script it runs from source at every start (~3 ms of CPU of each box's, for the whole init).

Runs inside untrusted boxes: stdlib only, small, no state.
"""

import sys

if __name__ == "__main__":
    sys.path.insert(0, __file__.rpartition("/")[0])  # -I leaves the script's directory off sys.path
    TYPE_CHECKING = False  # typing's flag, without importing typing: mypy reads the guest as the package, a box runs it flat
    if TYPE_CHECKING:
        from quinebox.guest import init
    else:
        import init
    init.run(sys.argv[1:])
