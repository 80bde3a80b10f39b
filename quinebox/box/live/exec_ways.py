"""How a command is started in a live box, one way per backend, behind the one BoxExec (execs.py).

- The box's init, where this process holds the box's lifeline (the box's owner: a Sandbox's process, `box
  create`'s holder): it forks the command in the box, already under every control of the box's; the host puts
  the child in a pids cgroup of its own before it runs anything (guest/execs.py). The fast way: a fork, not a
  runtime's start. Not under gVisor (its processes have no host pid or cgroup), nor with a terminal.
- An OCI runtime (runc, crun): the runtime starts the exec in a pids cgroup of its own (`exec --cgroup`); its
  stdin, stdout and stderr are the caller's own descriptors, as a box's init's are (direct.py).
- The engine: its exec cannot be placed, so it starts as a guest stub that stops itself; the host moves the
  stopped stub into the exec's cgroup, then lets it become the command. Its streams come over the engine's
  connection (relay.py).
- gVisor: the box's processes live in gVisor's kernel, not the host's, and have no host cgroup; an exec's
  tree is what `runsc ps` says descends from it (a process re-parented to the box's init escapes it there).

Each way is made, then started (`start`), so that what it made before a failure (its cgroup) is there to undo.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from quinebox.box.backends.dockerbox import DockerBox
from quinebox.box.backends.oci import say_unfiltered
from quinebox.box.backends.runtimebox import RuntimeBox
from quinebox.box.live.exec_cgroups import ExecCgroup, box_cgroup, cgroup_of, watchdog
from quinebox.box.net.init_line import InitLine
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.streams import relay
from quinebox.errors import EngineError
from quinebox.guest.execs import GO

if TYPE_CHECKING:
    from quinebox.box.backends.boxes import Box

#: The exit status of an exec whose tree was killed (as a shell reports SIGKILL).
EXIT_KILLED = 137
#: How long the init's child may take to say it is there (a fork, in a box that may be loaded).
START_TIMEOUT = 10.0
#: struct ucred: what SCM_CREDENTIALS carries (pid, uid, gid).
CREDENTIALS = struct.Struct("iII")
#: What runc and crun exit with when they could not start the command at all.
RUNTIME_FAILED = 255
#: The engine's stub: stop until the host has moved it into its exec's cgroup, then become the command with
#: the signals Python ignores given back their defaults. Guest code, so stdlib only and as small as this.
STOPPED_STUB = (
    "import os,signal,sys\n"
    "os.kill(os.getpid(),signal.SIGSTOP)\n"
    "for s in (signal.SIGPIPE,signal.SIGXFSZ):signal.signal(s,signal.SIG_DFL)\n"
    "a=sys.argv[1:]\n"
    "try:os.execvp(a[0],a)\n"
    "except FileNotFoundError:os.write(2,f'{a[0]}: command not found\\n'.encode());os._exit(127)\n"
    "except OSError as e:os.write(2,f'{a[0]}: {e.strerror}\\n'.encode());os._exit(126)\n"
)


class Way:
    """One exec's start, end and status on its box's backend."""

    def __init__(self, box: Box, session: str, *, tty: bool, guard: bool):
        self.box, self.session, self.tty, self.guard = box, session, tty, guard
        #: The exec's own cgroup, once made (none under gVisor).
        self.cgroup: ExecCgroup | None = None
        #: The watchdog's pipe (`guard`), once it runs.
        self.watchdog: int | None = None

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, fds: tuple[int, int, int]) -> None:
        raise NotImplementedError

    @property
    def copy_files(self) -> bool:
        """Whether a regular file among the exec's streams is read or written by us (direct.DirectStdio)."""
        return False

    def kill_untracked(self) -> None:
        """Kill the exec's tree where it has no cgroup to kill."""

    def resize(self, rows: int, cols: int) -> None:
        """The command's terminal takes this size (where the backend does not follow this terminal itself)."""

    def ended(self, timeout: float | None) -> bool:
        raise NotImplementedError

    def status(self) -> int:
        """The command's exit status, once ended; what the way holds of it let go."""
        raise NotImplementedError


def way_for(box: Box, session: str, *, tty: bool, guard: bool, line: InitLine | None = None) -> Way:
    """The box's init when this process holds its lifeline (`line`) and the box's processes are the host's
    (not gVisor's: its kernel's pids are not the host's, so no cgroup can hold them), for a command with no
    terminal run as the box's own user; else the backend's own exec."""
    if line is not None and not tty and not (isinstance(box, RuntimeBox) and box.runtime.gvisor):
        return InitWay(box, session, tty=tty, guard=guard, line=line)
    if isinstance(box, DockerBox):
        return EngineWay(box, session, tty=tty, guard=guard)
    assert isinstance(box, RuntimeBox)
    return RuntimeWay(box, session, tty=tty, guard=guard)


class InitWay(Way):
    """Started by the box's init, which this process reaches over the box's lifeline (guest/execs.py): a fork
    of a process that is in the box already, with every control of the box's, placed in the exec's own cgroup
    before it runs anything; its stdin, stdout and stderr are the caller's own descriptors, as a runtime exec's are."""

    def __init__(self, box: Box, session: str, *, tty: bool, guard: bool, line: InitLine):
        super().__init__(box, session, tty=tty, guard=guard)
        self.line = line

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, fds: tuple[int, int, int]) -> None:
        ours, theirs = socket.socketpair()
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the child's pid, in the host's terms, from the kernel
            self._exited = self.line.start(argv, cwd, env, [*fds, theirs.fileno()])
            theirs.close()
            pid = _sender_pid(ours, START_TIMEOUT)
            if pid is None:
                return  # the init could not fork it (it says so, and why, on the command's stderr): its status comes
            self.cgroup = ExecCgroup(cgroup_of(pid))
            self.cgroup.add(pid)
            if self.guard:
                self.watchdog = watchdog(self.cgroup)
            ours.sendall(GO)
        finally:
            theirs.close()
            ours.close()

    def ended(self, timeout: float | None) -> bool:
        return self._exited.done.wait(timeout)

    def status(self) -> int:
        return self._exited.code


def _sender_pid(sock: socket.socket, timeout: float) -> int | None:
    """The host pid of the process that wrote to `sock` (SO_PASSCRED set on it): the kernel's word. None when
    the socket ended with nothing written: no child was forked to write it."""
    sock.settimeout(timeout)
    try:
        data, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(CREDENTIALS.size))
    except TimeoutError:
        raise EngineError("the command did not start in the box in time: the box may be out of memory or processes") from None
    if not data:
        return None
    for level, kind, blob in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return int(CREDENTIALS.unpack(blob[: CREDENTIALS.size])[0])
    raise EngineError("the box's init gave no credentials for the command it started")


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


class EngineWay(Way):
    """The engine's exec, started as the stopped stub and placed in its cgroup before it runs."""

    box: DockerBox

    def start(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str, fds: tuple[int, int, int]) -> None:
        engine = self.box.engine
        command = [*GUEST_PYTHON, "-c", STOPPED_STUB, *argv]
        self._exec_id = engine.exec_create(self.box.id, command, tty=self.tty, user=user, cwd=cwd, env=list(env))
        self._sock = engine.exec_start(self._exec_id, tty=self.tty)
        stub = self._stopped_stub()
        self.cgroup = ExecCgroup(cgroup_of(stub))
        self.cgroup.add(stub)
        if self.guard:
            self.watchdog = watchdog(self.cgroup)
        if self.tty and os.isatty(fds[0]):  # sized while it waits: the command sees this terminal's size at once
            size = os.get_terminal_size(fds[0])
            engine.exec_resize(self._exec_id, size.lines, size.columns)
        os.kill(stub, signal.SIGCONT)
        self._stop_r, self._stop_w = os.pipe()
        # The engine's connection is the box's end of each stream: the relays hold copies of the fds a runtime
        # exec would have held, closed when they end (so a PIPE reader sees EOF then).
        self._relayed = [os.dup(fd) for fd in fds]
        self._relay = threading.Thread(target=self._relay_out, name=f"exec:{self.session}", daemon=True)
        self._relay.start()
        threading.Thread(target=self._relay_in, daemon=True).start()

    def _stopped_stub(self) -> int:
        """The engine's exec, by its host pid, once it has stopped itself."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid = self.box.engine.exec_pid(self._exec_id)
            if pid:
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
                except OSError:
                    state = "?"
                if state in ("T", "t"):
                    return pid
            time.sleep(0.002)
        raise EngineError("the command in the box did not start in time: the engine may be wedged (`quinebox doctor` checks)")

    def _relay_in(self) -> None:
        try:
            relay.pump_fd(self._relayed[0], self._sock, self._stop_r)
        finally:
            os.close(self._relayed[0])

    def _relay_out(self) -> None:
        reader = relay.reader_of(self._sock)
        try:
            if self.tty:
                relay.copy(reader, relay.fd_sink(self._relayed[1]))
            else:
                relay.demux(reader, relay.fd_sink(self._relayed[1]), relay.fd_sink(self._relayed[2]))
        except OSError:
            pass
        finally:
            reader.close()
            os.close(self._relayed[1])
            os.close(self._relayed[2])

    def resize(self, rows: int, cols: int) -> None:
        if self.tty:
            self.box.engine.exec_resize(self._exec_id, rows, cols)

    def ended(self, timeout: float | None) -> bool:
        self._relay.join(timeout)
        return not self._relay.is_alive()

    def status(self) -> int:
        os.write(self._stop_w, b"x")
        self._sock.close()
        os.close(self._stop_w)
        code = self.box.engine.exec_exit_code(self._exec_id)
        os.close(self._stop_r)
        return EXIT_KILLED if code is None else code


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
