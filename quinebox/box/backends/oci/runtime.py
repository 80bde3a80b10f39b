"""The OCI backend's thin layer over an OCI runtime's command line: runc by default, crun, gVisor's
runsc, or any binary that speaks the same verbs (run, state, kill, delete, list, exec).

Here too each runtime's Capabilities, so that `oci.runtime.Runtime` is a runtime with what its boxes can do.

Each method is one runtime invocation with a deadline (`QUINEBOX_RUNTIME_TIMEOUT`, 30 s; killing and deleting
10 s), its failure turned into one line of quinebox's own. Nothing here knows what a box is for: the bundle
(config.json, rendered by `policy.oci_config`) says everything a box may do.

Each runtime keeps its containers' state under the state dir (`oci/<runtime>/`), so boxes of one state dir are
found, listed and swept by that state dir's quinebox, as the engine's labels find its boxes.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quinebox.box.backends.boxes import Capabilities
from quinebox.errors import EngineError
from quinebox.state import state_dir

#: Killing and deleting get less: they must never hold up an exit.
QUICK_TIMEOUT = 10.0
#: Runtimes quinebox knows by name, with the global flags each needs here. runsc: the ptrace platform (Debian's
#: 2022 build cannot use systrap), no network stack of its own (a box has only loopback), and connecting to the
#: Unix sockets its mounts show (the box's host socket and egress socket are such mounts; as under runc), and
#: the box's own seccomp profile loaded inside the sandbox, in front of gVisor's kernel (as oci/policy.py's
#: `gvisor_seccomp` renders it for runsc; the host sees only the sentry's calls, under gVisor's own filter).
KNOWN = {
    "runc": (),
    "crun": (),
    "runsc": ("--platform=ptrace", "--network=none", "--host-uds=open", "--oci-seccomp"),
}


def runtime_hint(name: str) -> str:
    """What to do when the runtime `name` is missing: Debian packages each known runtime under its own name."""
    return f"install it (`apt-get install {name if name in KNOWN else 'runc'}`), name another with --runtime, or use --backend docker"


#: Where runsc's sandbox writes why it died (a Go panic: its kernel could not go on), in the box's bundle.
PANIC_LOG = "panic.log"


def runtime_timeout() -> float:
    return float(os.environ.get("QUINEBOX_RUNTIME_TIMEOUT", "30"))


CONTAINER_PREFIX = "quinebox-"


def container_id(session: str) -> str:
    return f"{CONTAINER_PREFIX}{session}"


def made_as(cid: str) -> str:
    """The session a runtime box was made as (its bundle's, its cgroup's name): a claimed warm box's is its own
    `pool-…`, whoever's session it serves now."""
    return cid.removeprefix(CONTAINER_PREFIX)


class TimedOut(EngineError):
    """The runtime did not answer within its deadline: told apart by its type, not its words."""


@dataclass(frozen=True)
class Runtime:
    """One OCI runtime binary and the directory it keeps its containers' state in."""

    name: str
    binary: str
    flags: tuple[str, ...] = ()

    @classmethod
    def named(cls, name: str) -> Runtime:
        """`runc`, `crun`, `runsc`, or a path to any runtime binary; EngineError when it is not installed."""
        binary = name if "/" in name else shutil.which(name) or next(
            (f"{d}/{name}" for d in ("/usr/sbin", "/usr/bin", "/sbin", "/usr/local/sbin", "/usr/local/bin") if os.access(f"{d}/{name}", os.X_OK)), None
        )
        if not binary or not os.access(binary, os.X_OK):
            raise EngineError(f"OCI runtime {name!r} not found: {runtime_hint(name)}")
        base = os.path.basename(binary)
        return cls(name=base, binary=binary, flags=KNOWN.get(base, ()))

    @property
    def root(self) -> Path:
        return state_dir() / "oci" / self.name

    @property
    def gvisor(self) -> bool:
        return self.name == "runsc"

    @property
    def capabilities(self) -> Capabilities:
        """What its boxes can do: gVisor's processes live in its own kernel (no host pids or cgroups, no user
        namespace, no host file as stdio) and it alone checkpoints here; runc's and crun's are the host's."""
        if self.gvisor:
            return Capabilities(pause=True, checkpoint=True, own_user_namespace=False, host_processes=False, stdio_files=False)
        return Capabilities(pause=True, checkpoint=False, own_user_namespace=True, host_processes=True, stdio_files=True)

    @property
    def label(self) -> str:
        return "gVisor (runsc)" if self.gvisor else self.name

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.root), *self.flags, *args]

    def _run(self, args: Sequence[str], what: str, *, timeout: float | None = None) -> subprocess.CompletedProcess:
        """A verb whose output is read (list, state): its output may be large, so it is read as it comes."""
        try:
            done = subprocess.run(self.argv(*args), timeout=timeout or runtime_timeout(), capture_output=True)
        except subprocess.TimeoutExpired:
            raise TimedOut(f"the OCI runtime {self.name} did not {what} in time: it may be wedged (`quinebox doctor` checks)") from None
        except OSError as exc:
            raise EngineError(f"cannot run the OCI runtime {self.binary}: {exc.strerror}; {runtime_hint(self.name)}") from None
        if done.returncode != 0:
            raise EngineError(f"the OCI runtime {self.name} could not {what}: {_reason(done.stderr)}")
        return done

    def _call(self, argv: list[str], what: str, *, timeout: float, stdio: tuple[Any, Any, Any] | None = None, new_session: bool = False) -> bytes:
        """A verb on a box's path (run, kill, delete): waited for on a pidfd, so its end is seen at once
        (subprocess's own deadline polls, up to 50 ms late); its stderr, unless `stdio` says where it goes."""
        try:
            proc = subprocess.Popen(argv, stdin=stdio[0] if stdio else subprocess.DEVNULL, stdout=stdio[1] if stdio else subprocess.DEVNULL,
                                    stderr=stdio[2] if stdio else subprocess.PIPE, start_new_session=new_session)
        except OSError as exc:
            raise EngineError(f"cannot run the OCI runtime {self.binary}: {exc.strerror}; {runtime_hint(self.name)}") from None
        if not _ended_within(proc, timeout):
            raise TimedOut(f"the OCI runtime {self.name} did not {what} in time: it may be wedged (`quinebox doctor` checks)")
        err = proc.stderr.read() if proc.stderr else b""
        if proc.stderr:
            proc.stderr.close()
        if proc.wait() != 0:
            raise EngineError(f"the OCI runtime {self.name} could not {what}: {_reason(err)}")
        return err

    def run(self, cid: str, bundle: str, *, stdio: tuple[int, int, int], pid_file: str, console_socket: str | None = None) -> None:
        """The box created and started in one invocation (`run --detach`: one runtime start-up per box, not two),
        `stdio` its init's own fds 0, 1 and 2.

        The runtime's own process leaves once the box runs, so its init is reparented to the nearest subreaper:
        the caller, which must be one to wait for the box's exit status (an init that exits at once stays the
        caller's zombie until it does)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The runtime's errors go to a file of ours, not to the box's stderr (which is the caller's).
        log = os.path.join(bundle, "runtime.log")
        extra = ["--console-socket", console_socket] if console_socket else []
        panic = ["--panic-log", os.path.join(bundle, PANIC_LOG)] if self.gvisor else []
        argv = self.argv("--log", log, "--log-format", "json", *panic, "run", "--detach", "--bundle", bundle, "--pid-file", pid_file, *extra, cid)
        for tries_left in range(START_TRIES - 1, -1, -1):
            try:
                self._call(argv, "start the box", timeout=runtime_timeout(), stdio=stdio, new_session=True)
                return
            except TimedOut:
                raise
            except EngineError:
                if tries_left and init_lost(log) and self.delete(cid):
                    os.unlink(log)  # the next start's words alone
                    continue
                raise EngineError(f"the OCI runtime {self.name} could not start the box: {_logged_reason(log)}") from None

    def pause(self, cid: str) -> None:
        """Stop every process of the box where it is (runsc: its kernel stops its tasks); `resume` lets them go on."""
        self._call(self.argv("pause", cid), "pause the box", timeout=QUICK_TIMEOUT)

    def resume(self, cid: str) -> None:
        self._call(self.argv("resume", cid), "resume the box", timeout=QUICK_TIMEOUT)

    def checkpoint(self, cid: str, image: str) -> None:
        """The box's memory, processes and open files written into the directory `image` (runsc). The sandbox ends
        once it is written, as this runsc always ends it (`--leave-running` only restores a new one in its place and
        waits on it); a paused one ends when it is resumed or killed."""
        try:
            self._call(self.argv("checkpoint", "--image-path", image, cid), "checkpoint the box", timeout=runtime_timeout())
        except TimedOut:
            raise
        except EngineError as exc:  # runsc says why on its first line, then dumps the object it could not save
            first = str(exc).splitlines()[0]
            raise EngineError(first.split("{", 1)[0].rstrip(": ")[:400]) from None

    def restore(self, cid: str, bundle: str, image: str, *, stdio: tuple[int, int, int], pid_file: str) -> None:
        """A box made from a checkpoint's `image` as `run` makes one from its bundle: started, detached, `stdio` its
        init's fds 0, 1 and 2, the caller (a subreaper) left to wait for it. Every mount the bundle names is the
        checkpointed box's, in the same order; their sources may differ (another world, another host socket)."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = os.path.join(bundle, "runtime.log")
        panic = ["--panic-log", os.path.join(bundle, PANIC_LOG)] if self.gvisor else []
        argv = self.argv("--log", log, "--log-format", "json", *panic, "restore", "--image-path", image, "--detach", "--bundle", bundle, "--pid-file", pid_file, cid)
        try:
            self._call(argv, "restore the box", timeout=runtime_timeout(), stdio=stdio, new_session=True)
        except TimedOut:
            raise
        except EngineError:
            raise EngineError(f"the OCI runtime {self.name} could not restore the box: {_logged_reason(log)}") from None

    def signal_init(self, cid: str, signal: str) -> None:
        """`signal` to the box's init alone (`kill` signals every process of it)."""
        self._call(self.argv("kill", cid, signal), f"signal the box's init ({signal})", timeout=QUICK_TIMEOUT)

    def kill(self, cid: str, signal: str = "KILL") -> bool:
        """Signal every process of the box. False only when the runtime could not be run or did not answer in
        time: a box that has stopped or is gone already (the runtime refuses those) is not running either way."""
        if not (self.gvisor and signal == "KILL"):
            return _status(self.argv("kill", "--all", cid, signal)) is not None
        # Under gVisor the box's init is killed, and the sandbox ends with it: a box restored from a snapshot under
        # another container id holds its processes under the old one in gVisor's kernel, which `--all` misses.
        # runsc refuses to signal a paused box (`quinebox box pause`): resumed first.
        done = _status(self.argv("kill", cid, signal))
        if done not in (0, None):
            _status(self.argv("resume", cid))
            done = _status(self.argv("kill", cid, signal))
        return done is not None

    def delete(self, cid: str) -> bool:
        """Remove the box, killed first if it still runs; its cgroup and state go with it. True only when the
        runtime no longer knows it; False when it refused or did not answer."""
        return deleted(self.argv(), cid)

    def containers(self) -> list[dict[str, Any]]:
        """Every container of this runtime's root: id, pid, status, bundle, annotations."""
        if not self.root.is_dir():
            return []
        listed = self._run(["list", "--format", "json"], "list its boxes", timeout=QUICK_TIMEOUT).stdout
        try:
            return json.loads(listed or b"null") or []
        except ValueError:
            return []

    def helper_pids(self, cid: str) -> list[int]:
        """The processes besides the box's init that the runtime leaves to its caller once `run` returns, to
        wait for when the box ends: runsc's gofer (its state file says which). runc leaves none."""
        if not self.gvisor:
            return []
        try:
            state = json.loads((self.root / f"{cid}_sandbox:{cid}.state").read_text())
            return [int(state["goferPid"])] if state.get("goferPid") else []
        except (OSError, ValueError, KeyError, TypeError):
            return []



def _ended_within(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether `proc` ended within `timeout`, waited for on a pidfd (seen at once; subprocess's own deadline
    polls, up to 50 ms late); one that did not is killed and reaped."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        ready = select.poll()
        ready.register(pidfd, select.POLLIN)
        if ready.poll(timeout * 1000):
            return True
        proc.kill()
        proc.wait()
        return False
    finally:
        os.close(pidfd)


def _status(argv: list[str]) -> int | None:
    """A quiet verb's exit status; None when it could not run or outlasted QUICK_TIMEOUT."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    return proc.wait() if _ended_within(proc, QUICK_TIMEOUT) else None


def deleted(runtime: list[str], cid: str) -> bool:
    """`runtime` (a Runtime's argv) told to delete `cid` by force: whether it is gone, deleted now or before. A
    delete that fails is asked after with `state`: only a runtime that no longer knows the box has removed it;
    one that does not answer in time has not. Plain argv, so the keeper (backends/keeper.py) deletes the same way."""
    done = _status([*runtime, "delete", "--force", cid])
    if done is None:
        return False
    return done == 0 or _status([*runtime, "state", cid]) not in (0, None)


def sandbox_death(bundle: str) -> str | None:
    """Why runsc's sandbox died, when it did (its panic log names it), in its own words: else None."""
    try:
        with open(os.path.join(bundle, PANIC_LOG), "rb") as log:
            head = log.read(64 << 10).decode(errors="replace")
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith("runtime: failed to create new OS thread"):  # Go says its cause first, then "fatal error: newosproc"
            return line.partition(": ")[2].strip()[:300]
        if line.startswith(("panic: ", "fatal error: ")):
            return line.partition(": ")[2].strip()[:300]
    return None


#: runc's words for a box whose `runc init` was gone before its first word to runc (libcontainer's initWaiter):
#: before the box's namespaces, its limits' cgroup or anything of its command. Rare, under load, in rootless
#: boxes (CI saw it ~twice in 15 rootless passes of ~1,500 starts each; 1,000 starts at -P8 here did not).
INIT_LOST = "waiting for init preliminary setup"
#: How often a box's start is tried when its init was lost so: nothing of the box ran, so it is started anew.
START_TRIES = 2


def init_lost(log: str) -> bool:
    """Whether runc's log at `log` says the box's init was lost before anything of the box was made (INIT_LOST):
    the one runtime failure quinebox tries again, read here where the runtime's words become quinebox's."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return False
    return any(INIT_LOST in str(_record(line).get("msg", "")) for line in text.splitlines())


def _record(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _reason(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no reason given"


def _logged_reason(log: str) -> str:
    """The last error the runtime logged (runc logs JSON lines with a msg). A runtime that logs nothing said
    why on the box's stderr, the only one it has while it starts the box."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return "it logged no reason (its own words, if any, are above)"
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if line.strip():
                return line.strip()
            continue
        if record.get("level") in ("error", "fatal") or "error" in str(record.get("msg", "")):
            return str(record.get("msg", line)).strip()
    return lines[-1].strip() if lines else "it logged no reason (its own words, if any, are above)"


#: Boxes this process has said it of: once per box, not once per exec.
_said_unfiltered: set[str] = set()
_said_lock = threading.Lock()


def say_unfiltered(session: str) -> None:
    """Say, once per box, that what `runsc exec` starts runs without the box's seccomp profile: this runsc loads
    the profile for the box's init only, and a box is never weaker than its policy without saying so."""
    with _said_lock:
        if session in _said_unfiltered:
            return
        _said_unfiltered.add(session)
    print(
        f"quinebox: box {session} is on gVisor: commands exec'd into it run without its seccomp profile "
        "(runsc loads it for the box's init only); gVisor's kernel still answers their system calls",
        file=sys.stderr,
        flush=True,
    )
