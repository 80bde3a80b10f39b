"""One hardened box: what it may do, and running it.

The box's rules, flat here and pure: what a caller asks for (options.py), what to run (spec.py), the one function
from a spec to the container configuration (policy.py, backends/oci/policy.py for
an OCI runtime's config.json, backends/bwrap/policy.py for bubblewrap's command line), what a box of `--image host` sees of the host's
root (policy_host.py), and a request's shape (shape.py). Beside them:
configure.py (what each backend's configure step shares), `BoxProcess` (process.py) and
`quinebox doctor` (doctor.py). The rest is in rooms, from the bottom up:

    streams/   a box's bytes and its terminal
    net/       its socket to the host, the model broker, egress and secrets
    backends/  the seam and its registry; one room per backend (docker/, oci/, bwrap/)
    images/    images found, built, unpacked and sealed; the guest's runtime
    pool/      warm boxes and claiming one
    run/       a box's launch on its backend, and its one ending
    owners/    every box found by its labels: ps, kill, gc
    live/      long-lived boxes, execs and entering them

Each room imports only the rooms below it (tests/unit/test_layout.py). The
rules sit between net and backends; configure between images and pool;
process and doctor at the top.

May import: worlds (a box mounts one), audit, the foundation modules and
guest.protocol. Knows nothing of agents or the tree: a box's place in a tree
reaches it as a `Place` it is handed.
"""
