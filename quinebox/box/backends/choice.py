"""Which backend a box runs on, and why: the fastest backend that holds this box's whole policy and can run boxes here.

Asked for by `--backend NAME` (registry.NAMES: auto and each backend registered) and `--runtime NAME|PATH` (or a policy file's `backend:`/`runtime:`), by
QUINEBOX_BACKEND / QUINEBOX_RUNTIME, or by `backend:`/`runtime:` in config.yaml, in that order. `auto` probes,
it does not assume: the OCI runtime is used when this process may create boxes with it (root, or a user this
machine gives user namespaces and a delegated cgroup: rootless.py), its binary is
there, the images live on this machine (no remote engine), and a probe box of the runtime ran here (the result
is kept per runtime binary in the state dir: a pass until the binary changes, a failure for PROBE_RETRY seconds,
as a runtime may fail one box under load and run the next). A box the runtime cannot give the same way (policy.oci_refusal)
runs on the engine, and `why` says so in one line; nothing is ever silently weaker.

`auto` ranks the backends fastest first (LADDER: bubblewrap's one process a box, then an OCI runtime's `runc run`,
then the engine's container) and takes the first that holds the box's whole policy and is usable here: bubblewrap
wherever it is usable (its binary, user namespaces, the `bwrap` extra, a cgroup for a plain user's boxes) and the box
asks nothing it cannot hold (`--image host`, `net:bridge`, `rootfs:rw`). A lasting box (`box create`, a Sandbox) is
not bwrap's under auto: it is entered later with a terminal or as another user (root included), which bwrap, with no
exec of its own and one id mapped, cannot (LASTING). Nor is a plain user's box (PLAIN_USER): bwrap as a plain user
maps the caller's own id alone, onto itself, so the box's user is not the one its policy names. A runtime named (`--runtime`) keeps auto on that runtime.
A box bubblewrap cannot hold (bwrap.policy.bwrap_refusal) asked of it by name is refused in one line, UNSUPPORTED,
before anything starts; bwrap asked for by name is not probed (as a runtime asked for outright is not).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quinebox.box.backends.oci.policy import Rootless
from quinebox.box.backends.oci.runtime import Runtime
from quinebox.box.backends.rootless import local_rootless, refusal
from quinebox.documents import load_config
from quinebox.errors import ErrorKind, GrantError, QuineboxError
from quinebox.state import state_dir

if TYPE_CHECKING:
    from quinebox.box.spec import BoxSpec

DEFAULT_RUNTIME = "runc"


#: The Docker engine's name among the backends; the OCI runtimes go by their own.
ENGINE = "docker"
#: bubblewrap's name among the backends (`--backend bwrap`).
BWRAP = "bwrap"
#: Why auto puts no lasting box on bwrap (asked for by name, bwrap holds one, and says what it cannot do in it).
LASTING = "a lasting box is entered later with a terminal or as another user, which bwrap cannot"
#: Why auto puts no plain user's box on bwrap (asked for by name, bwrap runs it as the caller's own id).
PLAIN_USER = "as a plain user bwrap maps the caller's own id alone, so the box's user cannot be the one its policy names"
#: `auto`'s ladder, fastest first (declared, and measured in bench/: a bwrap box ~10 ms, `runc run` ~45 ms of CPU, the
#: engine's container slower still): the first that holds the box's whole policy and is usable here runs it.
LADDER = (BWRAP, "oci", ENGINE)


def on_engine(backend: str) -> bool:
    """Whether a backend's name (a choice's, a record's, a listed box's) is the engine's."""
    return backend == ENGINE


@dataclass(frozen=True)
class Choice:
    backend: str  # "oci", ENGINE or BWRAP
    runtime: str | None  # the OCI runtime's name or path, with backend "oci"; None otherwise
    why: str

    @property
    def engine(self) -> bool:
        return on_engine(self.backend)

    @property
    def where(self) -> str:
        """The name a box of this choice is recorded and listed by, which registry.backend finds its backend by:
        the OCI runtime's own, or the backend's (the engine's, bwrap's)."""
        return self.runtime or (DEFAULT_RUNTIME if self.backend == "oci" else self.backend)


def requested(backend: str | None = None, runtime: str | None = None, *, known: Collection[str]) -> tuple[str, str | None]:
    """(the backend asked for, the runtime asked for or None), from the arguments, the environment, config.yaml;
    `known`: every name a backend may be asked for by (registry.NAMES: `auto` and each backend registered)."""
    config: dict = {}
    if not backend and not os.environ.get("QUINEBOX_BACKEND") or not runtime and not os.environ.get("QUINEBOX_RUNTIME"):
        config = load_config()
    chosen = backend or os.environ.get("QUINEBOX_BACKEND") or str(config.get("backend") or "auto")
    if chosen not in known:
        raise GrantError(f"bad backend {chosen!r}: use one of {', '.join(known)} (--backend, QUINEBOX_BACKEND or backend: in config.yaml)")
    named = runtime or os.environ.get("QUINEBOX_RUNTIME") or config.get("runtime")
    return chosen, str(named) if named else None


def choose(refusal: str | None, *, known: Collection[str], backend: str | None = None, runtime: str | None = None, probe: Callable[[str], str | None] | None = None,
           spec: BoxSpec | None = None, bwrap_refused: str | None = None, bwrap_probe: Callable[[], str | None] | None = None, lasting: bool = False,
           plain_user: bool | None = None) -> Choice:
    """The backend for one box. `refusal`: why this box cannot run on an OCI runtime (policy.oci_refusal), if it cannot;
    `bwrap_refused`: why bubblewrap cannot hold it (bwrap.policy.bwrap_refusal of `spec`, when `spec` is given).

    `probe(runtime)` → None when the runtime can run boxes here, else why not (default: `usable`); `bwrap_probe()`
    the same for bubblewrap (default: `bwrap_usable`); `lasting`: the box is a lasting one, which auto puts on no
    bwrap (LASTING); `plain_user`: the caller is not root (default: this process's euid), whose boxes auto puts on no
    bwrap (PLAIN_USER)."""
    asked, named = requested(backend, runtime, known=known)
    if on_engine(asked):
        return Choice(ENGINE, None, "the Docker backend was asked for")

    def refused_by_bwrap() -> str | None:
        if bwrap_refused is not None or spec is None:
            return bwrap_refused
        from quinebox.box.backends.bwrap.policy import bwrap_refusal  # imported only when bwrap is asked, or on auto's ladder

        return bwrap_refusal(spec)

    if asked == BWRAP:
        why = refused_by_bwrap()
        if why:
            # in bwrap_box's own words (bwrap/policy.py), said here before anything is made
            raise QuineboxError(f"refused on bwrap: {why}; use --backend oci", kind=ErrorKind.UNSUPPORTED, backend=BWRAP, why=why)
        return Choice(BWRAP, None, "the bwrap backend was asked for")
    passed = ""  # why auto passed bwrap over
    if asked == "auto" and not named:
        plain = os.geteuid() != 0 if plain_user is None else plain_user
        why = LASTING if lasting else PLAIN_USER if plain else refused_by_bwrap()
        problem = None if why else (bwrap_probe or bwrap_usable)()
        if not why and problem is None:
            return Choice(BWRAP, None, "boxes run on bwrap (bubblewrap), the fastest backend that holds this box here")
        passed = f"; not on bwrap, which cannot hold this box: {why}" if why else f"; not on bwrap, which is faster but not usable here: {problem}"
    name = named or DEFAULT_RUNTIME
    if refusal:
        if named and name != DEFAULT_RUNTIME:  # a runtime asked for by name (a policy may require gVisor) is never swapped for the engine's runc
            raise QuineboxError(f"the OCI runtime {name} cannot run this box: {refusal}; drop the runtime, or the grant")
        return Choice(ENGINE, None, f"this box runs on the Docker engine: {refusal}{passed}")
    if asked == "oci":
        return Choice("oci", name, f"the OCI backend was asked for ({name})")
    problem = (probe or usable)(name)
    if problem:
        if named:  # a runtime named outright that cannot run boxes is an error, never a quiet fallback
            raise QuineboxError(f"OCI runtime {name} cannot run boxes here: {problem}")
        return Choice(ENGINE, None, f"boxes run on the Docker engine: {problem}{passed}")
    return Choice("oci", name, f"boxes run on the OCI runtime {name}{passed}")


def usable(name: str) -> str | None:
    """None when the OCI runtime `name` can run boxes here, else the reason, found once per runtime binary
    (and asked of the state dir once per process: a command server's worker asks it anew)."""
    key = (name, os.getpid(), state_dir())
    with _probing:  # threads that start their first boxes at once (an Inspect task's samples) probe once, not each
        if key not in _known:
            _known[key] = _usable(name)
    return _known[key]


_known: dict[tuple[str, int, object], str | None] = {}
_probing = threading.Lock()


def _usable(name: str, *, run_probe: Callable[[Runtime], str | None] | None = None, now: float | None = None) -> str | None:
    who = local_rootless()
    refused = refusal(name, who)
    if refused is not None:
        return f"not root, and {refused.reason} (fix: {refused.fix})"
    if os.environ.get("DOCKER_HOST", "unix://").split("://")[0] not in ("unix", ""):
        return f"the engine at {os.environ['DOCKER_HOST']} is remote: its images are not on this machine"
    try:
        found = Runtime.named(name)
    except QuineboxError as exc:
        return str(exc)
    from quinebox.box.backends.probe import kept, probe_runtime

    if run_probe is None:
        rootless = who if isinstance(who, Rootless) else None
        run_probe = lambda runtime: probe_runtime(runtime, rootless=rootless)  # noqa: E731
    probe = run_probe

    def twice() -> str | None:  # runc 1.1 can fail a box under load ("unable to store init state") and run the next
        problem = probe(found)
        return probe(found) if problem is not None else None

    return kept(state_dir() / "oci" / f"{found.name}.probe", found.binary, twice, now=now)


def bwrap_usable() -> str | None:
    """None when bubblewrap can run boxes here, else why and the one command that fixes it (ways.local_bwrap_way),
    found once per process and state dir (the probe box once per bwrap binary: probe.bwrap_probed)."""
    from quinebox.box.backends.ways import local_bwrap_way

    key = (BWRAP, os.getpid(), state_dir())
    with _probing:
        if key not in _known:
            way = local_bwrap_way()
            _known[key] = None if way.works else f"bwrap {way.what} (fix: {way.fix})"
    return _known[key]
