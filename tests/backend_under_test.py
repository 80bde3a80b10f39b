"""Which backend's kernel view a pass runs the box suites on, for the cases where that view answers a question its own
way: there each case asserts that backend's own answer, never skipped, never weaker. A pass of scripts/test.sh names
one (QUINEBOX_BACKEND / QUINEBOX_RUNTIME), or names none and gets what `auto` chooses here for a box that asks for no
backend (choice.choose, as `quinebox doctor`'s "default:" line says it): bubblewrap where it is usable.

- gVisor (`QUINEBOX_RUNTIME=runsc` on the OCI backend): its own kernel, /proc and sysfs, and errnos of its own.
- bubblewrap (`QUINEBOX_BACKEND=bwrap`): the host's kernel, as on runc, but no /sys at all (bwrap 0.8 cannot mount a
  sysfs, and binding the host's would show its devices: backends/bwrap/policy.py), so no cgroupfs in the box either:
  the limits are asked of the box's cgroup from the host; the image's files, owned by host ids the box's user
  namespace does not map, are the overflow id's (nobody) inside; and what bwrap cannot hold (`--image host`,
  `net:bridge`, `rootfs:rw`) is refused in one line when bwrap is asked for by name (UNSUPPORTED, exit 125), nothing
  started, and runs on the next backend of auto's ladder when it is not.
"""

import glob
import os

from quinebox.box.backends.choice import choose
from quinebox.box.backends.registry import NAMES

_CHOSEN = choose(None, known=NAMES)
#: The backend a box that asks for none runs on in this pass ("bwrap", "oci" or "docker"), and its OCI runtime.
BACKEND, RUNTIME = _CHOSEN.backend, _CHOSEN.runtime
#: The box runs on gVisor's kernel (`--runtime runsc` on the OCI backend).
GVISOR = BACKEND == "oci" and RUNTIME == "runsc"
#: The box is one `bwrap` process (`--backend bwrap`, or auto's choice where bubblewrap is usable).
BWRAP = BACKEND == "bwrap"
#: bwrap asked for by name (not auto's choice): a box it cannot hold is refused, not run on the next backend.
BWRAP_NAMED = BWRAP and os.environ.get("QUINEBOX_BACKEND") == "bwrap"
#: The overflow uid/gid (/proc/sys/kernel/overflowuid): what a user namespace shows for a host id it does not map.
OVERFLOW_ID = 65534


def host_cgroup(session: str, controller: str) -> str:
    """The box's own cgroup directory in one v1 hierarchy (or the unified one: controller "unified"), as the host sees
    it: `quinebox-SESSION` at the top as root, below the user's delegated subtree as a plain user (rootless.py)."""
    found = glob.glob(f"/sys/fs/cgroup/{controller}/quinebox-{session}") + glob.glob(f"/sys/fs/cgroup/{controller}/quinebox.user-*/quinebox-{session}")
    assert len(found) == 1, (controller, session, found)
    return found[0]
