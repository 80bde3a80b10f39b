"""Each way a box could run on this machine — bubblewrap, the OCI runtimes runc, crun and runsc, and the Docker
engine — whether it works here, and for one that does not, why and the one command that fixes it (`quinebox doctor`).

bubblewrap's fixes: its binary (`apt-get install bubblewrap`), the `bwrap` extra that compiles its seccomp filter
(`pip install 'quinebox[bwrap]'`), user namespaces for the unprivileged id it runs as (root's boxes too run as one),
a cgroup a plain user may place boxes in (`sudo quinebox setup-user NAME`), a probe box bwrap would not run.

The reasons are told apart because their fixes differ: a runtime not installed (`apt-get install crun`), a
user who is not root on a machine that keeps them from boxes (no user namespaces, no delegated cgroup:
rootless.py), a remote engine, crun refusing a hybrid cgroup
hierarchy, a probe box the runtime would not run; an engine not installed, not running, running with a
socket this user may not open (reach.py), or answering without seccomp or cgroup limits. `runtime_way` and
`engine_way` and `bwrap_way` take what they judge as arguments, so their tables are tested without a machine to match.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quinebox.box.backends.reach import Unreachable, as_root, engine_socket, unreachable
from quinebox.box.backends.rootless import Refusal, local_hierarchy, local_rootless, refusal
from quinebox.errors import QuineboxError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend

#: The OCI runtimes quinebox knows, in the order `quinebox doctor` lists them (runc is the default).
RUNTIME_NAMES = ("runc", "crun", "runsc")
ENGINE = "engine"
BWRAP = "bwrap"
#: The fix for a missing `bwrap` extra (pyseccomp, libseccomp's Python API, which compiles a box's seccomp filter).
BWRAP_EXTRA = "pip install 'quinebox[bwrap]'"


@dataclass(frozen=True)
class Way:
    name: str  # a runtime's name, or ENGINE
    works: bool
    what: str  # one line: what runs boxes here, or why it cannot (after its label)
    fix: str = ""  # for a way that does not work: the one command (or step) that fixes it

    @property
    def label(self) -> str:
        return {ENGINE: "Docker engine", "runsc": "runsc (gVisor)", BWRAP: "bwrap (bubblewrap)"}.get(self.name, self.name)


def runtime_way(name: str, *, binary: str | None, unprivileged: Refusal | None, docker_host: str, hierarchy: str, probe: Callable[[], str | None]) -> Way:
    """Whether the OCI runtime `name` (found at `binary`, or None) can run boxes here; `unprivileged`: why this
    user, not root, may have no box here (rootless.py), or None; `probe()` runs a probe box (asked only when
    nothing else already says no) and gives None or the runtime's reason."""
    if binary is None:
        package = name if name in RUNTIME_NAMES else "runc"
        return Way(name, False, "not installed", as_root(f"apt-get install {package}"))
    if unprivileged is not None:
        return Way(name, False, f"not root, and {unprivileged.reason}", unprivileged.fix)
    scheme = docker_host.split("://")[0] if docker_host else "unix"
    if scheme not in ("unix", ""):
        return Way(name, False, f"the engine at {docker_host} is remote: its images are not on this machine, and OCI boxes need them here",
                   "unset DOCKER_HOST (to use this machine's engine), or unpack an image with `quinebox image load FILE`")
    problem = probe()
    if problem is None:
        return Way(name, True, f"runs boxes here ({binary}; a hardened probe box ran)")
    if name == "crun" and hierarchy == "hybrid":
        return Way(name, False, f"crun refuses the hybrid cgroup hierarchy (v1 controllers, v2 beside them): {problem}",
                   "use runc, the default (`--runtime runc`); crun needs a pure cgroup v2 machine (kernel cmdline systemd.unified_cgroup_hierarchy=1)")
    return Way(name, False, problem, "use another runtime (`--runtime runc`), or the Docker engine (`--backend docker`)")


def bwrap_way(*, binary: str | None, userns: Refusal | None, extra: bool, cgroup: Refusal | None, probe: Callable[[], str | None]) -> Way:
    """Whether bubblewrap can run boxes here. `binary`: bwrap's path, or None; `userns`: why the unprivileged id bwrap
    runs as would get no user namespace (rootless.userns_refusal), or None; `extra`: whether the `bwrap` extra is
    installed; `cgroup`: why this user, not root, has no cgroup to place boxes in (rootless.py), or None; `probe()`
    runs a probe box (asked only when nothing else already says no) and gives None or bwrap's reason."""
    if binary is None:
        return Way(BWRAP, False, "not installed", as_root("apt-get install bubblewrap"))
    if userns is not None:
        return Way(BWRAP, False, userns.reason, userns.fix)
    if not extra:
        return Way(BWRAP, False, "the bwrap extra is not installed (pyseccomp: libseccomp's Python API, which compiles a box's seccomp filter)", BWRAP_EXTRA)
    if cgroup is not None:
        return Way(BWRAP, False, f"not root, and {cgroup.reason}", cgroup.fix)
    problem = probe()
    if problem is None:
        return Way(BWRAP, True, f"runs boxes here ({binary}; a hardened probe box ran)")
    return Way(BWRAP, False, problem, "use the OCI backend (`--backend oci`)")


def engine_way(*, blocked: Unreachable | None, answer: Callable[[], tuple[dict, dict, str]]) -> Way:
    """Whether the Docker engine can run boxes here. `blocked`: why its socket cannot be opened (reach.unreachable);
    `answer()`: (its info, its version, where it is), raising when it does not answer."""
    if blocked is not None:
        return Way(ENGINE, False, blocked.reason, blocked.fix)
    try:
        info, version, where = answer()
    except QuineboxError as exc:
        return Way(ENGINE, False, str(exc), "restart the engine, or check DOCKER_HOST")
    except OSError as exc:  # an engine that stopped answering between requests (requests' and docker-py's errors are OSErrors)
        return Way(ENGINE, False, f"did not answer: {exc}", "restart the engine")
    what = f"{version.get('Version')} (API {version.get('ApiVersion')}) at {where}"
    if "seccomp" not in " ".join(info.get("SecurityOptions") or []):
        return Way(ENGINE, False, f"{what} has no seccomp", "use a Docker engine built with seccomp and a kernel with CONFIG_SECCOMP_FILTER")
    if not info.get("MemoryLimit"):
        return Way(ENGINE, False, f"{what} cannot limit memory", "enable the memory cgroup controller (kernel cmdline cgroup_enable=memory)")
    if not info.get("PidsLimit"):
        return Way(ENGINE, False, f"{what} cannot limit pids", "enable the pids cgroup controller")
    return Way(ENGINE, True, f"{what}: seccomp, memory and pids limits")


def find_runtime(name: str) -> str | None:
    from quinebox.box.backends.oci.runtime import Runtime

    try:
        return Runtime.named(name).binary
    except QuineboxError:
        return None


def local_runtime_way(name: str, usable: Callable[[str], str | None]) -> Way:
    """runtime_way for this machine: the binary looked up, the probe box run once per binary (`usable`: choice.usable,
    handed in so that choice.py, which asks this room for bwrap's way, is never imported from here)."""
    hierarchy = local_hierarchy()
    return runtime_way(name, binary=find_runtime(name), unprivileged=refusal(name, local_rootless()), docker_host=os.environ.get("DOCKER_HOST", ""),
                       hierarchy=hierarchy, probe=lambda: usable(name))


def local_bwrap_way(probe: Callable[[str], str | None] | None = None) -> Way:
    """bwrap_way for this machine: the binary looked up, the probe box run once per binary (probe.bwrap_probed;
    `probe(binary)`: another, for a test)."""
    import shutil
    from importlib.util import find_spec

    from quinebox.box.backends.probe import bwrap_probed
    from quinebox.box.backends.rootless import _sysctl, userns_refusal

    binary = shutil.which("bwrap")
    who = local_rootless()
    return bwrap_way(binary=binary, userns=userns_refusal(_sysctl), extra=find_spec("pyseccomp") is not None, cgroup=who if isinstance(who, Refusal) else None,
                     probe=lambda: (probe or bwrap_probed)(binary or "bwrap"))


def local_engine_way(connect: Callable[[], DockerBackend]) -> Way:
    """engine_way for this machine; `connect()` gives a DockerBackend (asked only once its socket opens)."""

    def answer() -> tuple[dict, dict, str]:
        backend = connect()
        return backend.quick.info(), backend.quick.version(), f"unix://{engine_socket()}" if engine_socket() else os.environ["DOCKER_HOST"]

    return engine_way(blocked=unreachable(), answer=answer)
