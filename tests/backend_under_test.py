"""Which backend's kernel view a pass runs the box suites on (scripts/test.sh sets it), for the cases where that view
answers a question its own way: there each case asserts that backend's own answer, never skipped, never weaker.

- gVisor (`QUINEBOX_RUNTIME=runsc` on the OCI backend): its own kernel, /proc and sysfs, and errnos of its own.
- bubblewrap (`QUINEBOX_BACKEND=bwrap`): the host's kernel, as on runc, but no /sys at all (bwrap 0.8 cannot mount a
  sysfs, and binding the host's would show its devices: backends/bwrap/policy.py), so no cgroupfs in the box either:
  the limits are asked of the box's cgroup from the host; the image's files, owned by host ids the box's user
  namespace does not map, are the overflow id's (nobody) inside; and what bwrap cannot hold (`--image host`, an
  overlay world, `net:bridge`, `rootfs:rw`) is refused in one line (UNSUPPORTED, exit 125), nothing started.
"""

import glob
import os

BACKEND = os.environ.get("QUINEBOX_BACKEND", "")
#: The box runs on gVisor's kernel (`--runtime runsc` on the OCI backend).
GVISOR = os.environ.get("QUINEBOX_RUNTIME") == "runsc" and BACKEND not in ("docker", "bwrap")
#: The box is one `bwrap` process (`--backend bwrap`).
BWRAP = BACKEND == "bwrap"
#: The overflow uid/gid (/proc/sys/kernel/overflowuid): what a user namespace shows for a host id it does not map.
OVERFLOW_ID = 65534


def host_cgroup(session: str, controller: str) -> str:
    """The box's own cgroup directory in one v1 hierarchy (or the unified one: controller "unified"), as the host sees
    it: `quinebox-SESSION` at the top as root, below the user's delegated subtree as a plain user (rootless.py)."""
    found = glob.glob(f"/sys/fs/cgroup/{controller}/quinebox-{session}") + glob.glob(f"/sys/fs/cgroup/{controller}/quinebox.user-*/quinebox-{session}")
    assert len(found) == 1, (controller, session, found)
    return found[0]
