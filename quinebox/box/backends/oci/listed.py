"""One box on an OCI runtime as its runtime's `list` shows it: a Box (boxes.py) that owns its runtime, id and bundle.

Whoever lists the boxes (ps, kill, gc, `exec --in`, pause, snapshots) sees these; the process that made a box holds
its OciBox (oci/box.py), which ends the same way: kill through the runtime, and removal through boxroot.remove_box.
What each runtime can do is its Runtime's `capabilities` (runtime.py):

- runc, crun: paused by the cgroup freezer (freezer.py); an exec is the runtime's own `exec`, started in a pids
  cgroup of its own (`exec --cgroup`), its stdin, stdout and stderr the caller's own descriptors, as a box's
  init's are (direct.py); the box's user namespace maps its own ids (`id_ranges`).
- gVisor (runsc): paused by `runsc pause` (the host's freezer would stop the sentry itself); the box's processes
  live in gVisor's kernel, not the host's, and have no host cgroup: an exec's tree is what `runsc ps` says
  descends from it (a process re-parented to the box's init escapes it there). Its checkpoint and restore are
  the one way quinebox snapshots a box (live/checkpoints.py drives them through this Box).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from quinebox.box.backends.boxes import Box, Capabilities, IdRanges, Way
from quinebox.box.backends.exec_cgroups import ExecCgroup, box_cgroup, watchdog
from quinebox.box.backends.oci.box import held, oci_runtime
from quinebox.box.backends.oci.boxroot import IMAGE_ROOT, bundle_of, remove_box
from quinebox.box.backends.oci.criu import criu_fails
from quinebox.box.backends.oci.freezer import set_freezer
from quinebox.box.backends.oci.runtime import Runtime, made_as, say_unfiltered
from quinebox.box.policy import LABEL_SESSION
from quinebox.errors import EngineError, QuineboxError
from quinebox.state import state_dir

#: What runc and crun exit with when they could not start the command at all.
RUNTIME_FAILED = 255


class RuntimeBox(Box):
    """A container of quinebox's on `runtime`; its bundle is found from its session (boxroot.bundle_of)."""

    def __init__(self, runtime: Runtime, cid: str, labels: Mapping[str, str], *, state: str = "?", command: str = "", image_root: str = "", made: float = 0.0):
        self.runtime = runtime
        self.id = cid
        self.labels = labels
        self.backend = runtime.name
        self.state = state
        self.command = command
        self.image_root = image_root
        self.made = made

    @property
    def capabilities(self) -> Capabilities:  # type: ignore[override]  # the runtime's, read when asked
        return self.runtime.capabilities

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.runtime.label

    @property
    def made_as(self) -> str:
        """The session the box was made as, which names its bundle and cgroup (a claimed warm box's is its own)."""
        return made_as(self.id)

    @property
    def bundle(self) -> Path:
        return bundle_of(self.made_as)

    def kill(self, signal: str = "KILL") -> bool:
        return self.runtime.kill(self.id, signal)

    def destroy(self) -> bool:
        return remove_box(self.runtime.argv(), self.id, self.bundle)

    def process(self) -> tuple[str, str]:
        """From its bundle's config: the runtime's own state has no process in it."""
        try:
            process = json.loads((self.bundle / "config.json").read_text())["process"]
            return f"{process['user']['uid']}:{process['user']['gid']}", process.get("cwd") or "/"
        except (OSError, ValueError, KeyError, TypeError):
            raise EngineError(f"box {self.session} is going away: its bundle is gone") from None

    def why_not(self, capability: str) -> str:
        if capability == "own_user_namespace" and self.runtime.gvisor:
            return "gVisor's box has no user namespace, and its gofer makes root's files as the host's root"
        if capability == "own_user_namespace":
            return f"a box on {self.runtime.name} has no user namespace of its own"
        if capability == "checkpoint":
            criu = criu_fails()
            why = f"CRIU does not work here ({criu})" if criu else "quinebox takes snapshots on gVisor only"
            return f"whose checkpoints go through CRIU, and {why}"
        return super().why_not(capability)

    def freeze(self) -> None:
        if self.runtime.gvisor:
            self.runtime.pause(self.id)
        else:
            set_freezer(self.bundle, self.session, frozen=True)

    def thaw(self) -> None:
        if self.runtime.gvisor:
            self.runtime.resume(self.id)
        else:
            set_freezer(self.bundle, self.session, frozen=False)

    def exec_way(self, session: str, *, tty: bool, guard: bool) -> Way:
        return RuntimeWay(self, session, tty=tty, guard=guard)

    def held(self) -> bool:
        return held(self.id) is not None

    def execs_running(self) -> int:
        """How many of the runtime's `exec` processes for this box run on the host, whoever started them: each
        holds its exec's streams in the box until it ends."""
        root, cid = os.fsencode(self.runtime.root), os.fsencode(self.id)
        count = 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            count += b"exec" in args and root in args and cid in args
        return count

    def host_links(self) -> int:
        """How many connections from inside the box to the host are open: under runsc every one is made by the
        box's gofer (--host-uds=open), as a stream socket in the gofer's own network namespace, which holds no other."""
        count = 0
        for gofer in self.runtime.helper_pids(self.id):
            try:
                rows = Path(f"/proc/{gofer}/net/unix").read_text().splitlines()[1:]
            except OSError:
                raise EngineError(f"cannot look at box {self.session}'s gofer (pid {gofer}): it is gone") from None
            count += sum(1 for row in rows if len(row.split()) > 4 and row.split()[4] == "0001")
        return count

    def signal_init(self, signal: str) -> None:
        self.runtime.signal_init(self.id, signal)

    def checkpoint(self, image: str, stdio: tuple[int, int, int], meanwhile: Callable[[], None]) -> None:
        """Through the OciBox this process holds (ocibox.OciBox.succeed): only its maker waits for its init."""
        oci = held(self.id)
        if oci is None or not self.capabilities.checkpoint:
            raise QuineboxError(f"box {self.session} is not held by this process: its owner takes its snapshots")
        oci.succeed(image, stdio, meanwhile)

    def id_ranges(self) -> IdRanges | None:
        """The uids and gids its user namespace maps, each as (first id in the box, count), from its bundle's
        config; None when it has none (a gVisor box: its ids are its sandbox's)."""
        try:
            linux = json.loads((self.bundle / "config.json").read_text())["linux"]
            if "uidMappings" not in linux:
                return None
            uids, gids = ([(int(m["containerID"]), int(m["size"])) for m in linux[key]] for key in ("uidMappings", "gidMappings"))
            return uids, gids
        except (OSError, ValueError, KeyError, TypeError):
            raise EngineError(f"box {self.session} is going away: its bundle is gone") from None


def runtime_boxes() -> list[RuntimeBox]:
    """quinebox's boxes on every OCI runtime this state dir has used (a runtime no longer installed, or not
    answering, is skipped: `gc` tries again later)."""
    found = []
    roots = state_dir() / "oci"
    for root in sorted(roots.iterdir()) if roots.is_dir() else ():
        if not root.is_dir():
            continue
        try:
            runtime = oci_runtime(root.name)
            listed = runtime.containers()
        except EngineError:
            continue
        for entry in listed:
            labels = entry.get("annotations") or {}
            if LABEL_SESSION not in labels:
                continue
            try:
                args = json.loads(Path(entry.get("bundle", ""), "config.json").read_text())["process"]["args"]
            except (OSError, ValueError, KeyError):
                args = []
            found.append(RuntimeBox(
                runtime, entry["id"], labels, state=entry.get("status", "?"), command=" ".join(args),
                image_root=labels.get(IMAGE_ROOT) or entry.get("rootfs", ""),
            ))
    return found


class RuntimeWay(Way):
    """The OCI runtime's own `exec`."""

    box: RuntimeBox

    @property
    def copy_files(self) -> bool:
        return self.box.runtime.gvisor

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, fds: tuple[int, int, int]) -> None:
        runtime = self.box.runtime
        cgroup: list[str] = []
        if not runtime.gvisor:
            self.cgroup = ExecCgroup(box_cgroup(self.box.made_as))
            cgroup = ["--cgroup", self.cgroup.runtime_arg]
            if self.guard:
                self.watchdog = watchdog(self.cgroup)
        self._process: Path | None = None
        size = _terminal_size(fds[0]) if self.tty and not runtime.gvisor else None
        if size is not None:
            # Sized before the command runs (the runtime's init sets it on the pty it makes): `--tty` alone has
            # the runtime size it only after the command has started, which a quick `stty size` loses the race to.
            bundle = self.box.bundle
            spec = json.loads((bundle / "config.json").read_text())
            self._process = bundle / f"exec-{os.urandom(4).hex()}.json"
            self._process.write_text(json.dumps(sized_process(spec["process"], argv, cwd, env, user, size)))
            options = ["--process", str(self._process), *cgroup]
            argv = ()
        else:
            options = [*(["--tty"] if self.tty else []), "--user", user, "--cwd", cwd, *cgroup, *(a for e in env for a in ("--env", e))]
        self._pid_file: str | None = None
        if runtime.gvisor:
            say_unfiltered(self.session)
            self._pid_file = f"/tmp/.quinebox-exec-{os.getpid()}-{os.urandom(4).hex()}"
            options += ["--internal-pid-file", self._pid_file]
        # The runtime's own errors (no such command) go to a log of ours, to be said as a shell says them.
        self._log = str(self.box.bundle / f"exec-{os.urandom(4).hex()}.log")
        full = runtime.argv("--log", self._log, "--log-format", "json", "exec", *options, self.box.id, *argv)
        try:
            self._proc = subprocess.Popen(full, stdin=fds[0], stdout=fds[1], stderr=fds[2])
        except OSError as exc:
            raise EngineError(f"cannot run the OCI runtime {runtime.binary}: {exc.strerror}") from None

    def kill_untracked(self) -> None:
        """Under gVisor: what `runsc ps` says descends from the exec's process."""
        runtime = self.box.runtime
        try:
            root = int(Path(self._pid_file).read_text())  # type: ignore[arg-type]  # set with the runtime's --internal-pid-file above
        except (OSError, ValueError, TypeError):
            self._proc.kill()
            return
        for pid in _descendants(runtime.argv("ps", self.box.id), root):
            subprocess.run(runtime.argv("kill", "--pid", str(pid), self.box.id, "KILL"), capture_output=True, timeout=10)

    def ended(self, timeout: float | None) -> bool:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def status(self) -> int:
        code = self._proc.returncode
        code = 128 - code if code < 0 else self._not_started(code)
        for path in (self._pid_file, self._process):
            if path:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        return code

    def _not_started(self, code: int) -> int:
        """The runtime's failure to start the command, as a shell's status (127 not found, 126 not executable)."""
        try:
            logged = Path(self._log).read_text(errors="replace")
            os.unlink(self._log)
        except OSError:
            return code
        if code != RUNTIME_FAILED:
            return code
        reason = "\n".join(str(json.loads(line).get("msg", "")) for line in logged.splitlines() if line.startswith("{")) or logged
        # The runtime has said why on the command's stderr itself: only the status is left to give, as a shell's.
        return 127 if "not found" in reason or "no such file" in reason else 126 if "permission denied" in reason else code


def _terminal_size(fd: int) -> tuple[int, int] | None:
    """(rows, columns) of the terminal `fd` is, or None: not a terminal, or one with no size set."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return (size.lines, size.columns) if size.lines and size.columns else None


def sized_process(process: dict, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, size: tuple[int, int]) -> dict:
    """The runtime's `exec --process` for a terminal exec of `size`: the box's own process (its capabilities,
    NoNewPrivs, rlimits and groups, as `exec` without `--process` starts from) with what the exec's own flags
    would have set -- its argv, cwd, added env, uid:gid and a terminal -- and the terminal's size."""
    uid, _, gid = user.partition(":")
    own = process.get("user", {})
    return {
        **process,
        "args": list(argv),
        "cwd": cwd,
        "env": [*process.get("env", []), *env],
        "user": {**own, "uid": int(uid), "gid": int(gid) if gid else own.get("gid", int(uid))},
        "terminal": True,
        "consoleSize": {"height": size[0], "width": size[1]},
    }


def _descendants(ps_argv: list[str], root: int) -> list[int]:
    """`root` and what descends from it, by the parent links of `runsc ps`'s table (its JSON lists pids only)."""
    try:
        table = subprocess.run(ps_argv, capture_output=True, timeout=10).stdout.decode(errors="replace").splitlines()
    except subprocess.TimeoutExpired:
        return [root]
    children: dict[int, list[int]] = {}
    for row in table[1:]:
        fields = row.split()
        if len(fields) > 2 and fields[1].isdigit() and fields[2].isdigit():
            children.setdefault(int(fields[2]), []).append(int(fields[1]))
    found, frontier = [root], [root]
    while frontier:
        frontier = [child for parent in frontier for child in children.get(parent, []) if child not in found]
        found += frontier
    return found[::-1]
