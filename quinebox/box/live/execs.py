"""A command run in a live box beside its main process: the OCI runtime's own `exec`, or the engine's.

An exec's timeout, its `kill` and the death of whoever waits for it must end every process the command
started — one that calls setsid() or forks twice included — and leave the box up. So each exec gets a pids
cgroup of its own below its box's, and nothing inside a box can leave a cgroup (it sees no cgroupfs it may
write): killing what that cgroup lists ends the exec's whole tree and nothing else.

- runc (and crun): the runtime starts the exec in that cgroup (`exec --cgroup`); its stdin, stdout and
  stderr are the caller's own descriptors, as a box's init's are (direct.py).
- The engine: its exec cannot be placed, so it starts as a guest stub that stops itself; the host moves the
  stopped stub into the cgroup, then lets it become the command. Its streams come over the engine's
  connection (relay.py).
- gVisor: the box's processes live in gVisor's kernel, not the host's, and have no host cgroup; an exec's
  tree is what `runsc ps` says descends from it (a process re-parented to the box's init escapes it there).

Left-over processes of an exec that ended by itself (a server started in the background) keep running, as
under `docker exec`; they go with their box.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from quinebox.box.streams import relay
from quinebox.box.backends.oci import say_unfiltered
from quinebox.box.backends.ocibox import oci_runtime
from quinebox.box.streams.direct import DirectStdio, Stream
from quinebox.box.live.exec_cgroups import ExecCgroup, box_cgroup, cgroup_of, watchdog
from quinebox.box.policy import GUEST_PYTHON
from quinebox.errors import EngineError, GrantError
from quinebox.state import run_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

#: The exit status of an exec whose tree was killed (as a shell reports SIGKILL); a timeout reports 124.
EXIT_KILLED = 137
EXIT_TIMEOUT = 124
#: How long the outputs of a killed exec may take to end (every process that held them is gone by then).
KILLED_GRACE = 10.0
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


@dataclass(frozen=True)
class Target:
    """What an exec needs to know of its box: where it runs, and its process's user and directory."""

    session: str
    container: str
    #: "docker", or the OCI runtime's name.
    backend: str
    user: str
    cwd: str


def target_of(session: str, container: str, backend: str, bundle: Path | None, docker: DockerBackend | None = None) -> Target:
    """A live box's exec target: its OCI bundle's process (user and cwd), or the engine's view of it."""
    if backend != "docker":
        try:
            process = json.loads((bundle / "config.json").read_text())["process"]  # type: ignore[operator]
        except (OSError, ValueError, KeyError, TypeError):
            raise EngineError(f"box {session} is going away: its bundle is gone") from None
        return Target(session, container, backend, f"{process['user']['uid']}:{process['user']['gid']}", process.get("cwd") or "/")
    assert docker is not None
    config = docker.container_config(container)
    return Target(session, container, backend, config.get("User") or "", config.get("WorkingDir") or "/")


class BoxExec:
    """One command running in a live box, its streams connected like subprocess.Popen's (direct.DirectStdio's)."""

    def __init__(
        self,
        target: Target,
        argv: Sequence[str],
        *,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        cwd: str | None = None,
        env: Sequence[str] = (),
        user: str | None = None,
        tty: bool = False,
        guard: bool = False,
        docker: DockerBackend | None = None,
    ):
        """`tty`: the command gets a terminal (this process's, which the runtime sizes after it; on the engine
        its output is then one stream, on stdout). `guard`: a forked watchdog kills the exec's tree if this
        process dies before the exec ends (for a CLI process, whose box is owned by another)."""
        if not argv:
            raise GrantError("nothing to run: give a command, as in `quinebox exec --in ID -- CMD [ARGS...]`")
        self.target = target
        self.args = tuple(argv)
        self.returncode: int | None = None
        self.timed_out = False
        self._killed = False
        self._lock = threading.Lock()
        self._cgroup: ExecCgroup | None = None
        self._docker = docker
        self._tty = tty
        self._guard = guard
        self._watchdog: int | None = None
        self._stdio = stdio = DirectStdio(stdin, stdout, stderr)
        self.stdin, self.stdout, self.stderr = stdio.stdin, stdio.stdout, stdio.stderr
        user = user or target.user
        cwd = os.path.join(target.cwd, cwd) if cwd else target.cwd  # a relative cwd is the box's working directory's
        try:
            if target.backend == "docker":
                self._start_engine(argv, cwd, env, user)
            else:
                self._start_runtime(argv, cwd, env, user)
        except BaseException:
            stdio.close()
            if self._cgroup is not None:
                self._cgroup.kill()
                self._cgroup.remove()
            raise
        stdio.started()
        stdio.box_gone()  # the host says nothing into an exec's stderr: so its end is the command's alone

    # -- starting ----------------------------------------------------------------------------

    def _start_runtime(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str) -> None:
        runtime = oci_runtime(self.target.backend)
        cgroup: list[str] = []
        if not runtime.gvisor:
            self._cgroup = ExecCgroup(box_cgroup(self.target.session))
            cgroup = ["--cgroup", self._cgroup.runtime_arg]
        if self._cgroup is not None and self._guard:
            self._watchdog = watchdog(self._cgroup)
        options = [*(["--tty"] if self._tty else []), "--user", user, "--cwd", cwd, *cgroup, *(a for e in env for a in ("--env", e))]
        self._pid_file = None
        if runtime.gvisor:
            say_unfiltered(self.target.session)
            self._pid_file = f"/tmp/.quinebox-exec-{os.getpid()}-{os.urandom(4).hex()}"
            options += ["--internal-pid-file", self._pid_file]
        # The runtime's own errors (no such command) go to a log of ours, to be said as a shell says them.
        self._log = str(run_dir() / f"{self.target.session}.oci" / f"exec-{os.urandom(4).hex()}.log")
        argv = runtime.argv("--log", self._log, "--log-format", "json", "exec", *options, self.target.container, *argv)
        try:
            self._proc = subprocess.Popen(argv, stdin=self._stdio.fds[0], stdout=self._stdio.fds[1], stderr=self._stdio.fds[2])
        except OSError as exc:
            raise EngineError(f"cannot run the OCI runtime {runtime.binary}: {exc.strerror}") from None
        self._runtime = runtime

    def _start_engine(self, argv: Sequence[str], cwd: str, env: Sequence[str], user: str) -> None:
        assert self._docker is not None
        docker = self._docker
        command = [*GUEST_PYTHON, "-c", STOPPED_STUB, *argv]
        self._exec_id = docker.exec_create(self.target.container, command, tty=self._tty, user=user, cwd=cwd, env=list(env))
        self._sock = docker.exec_start(self._exec_id, tty=self._tty)
        stub = self._stopped_stub(docker)
        self._cgroup = ExecCgroup(cgroup_of(stub))
        self._cgroup.add(stub)
        if self._guard:
            self._watchdog = watchdog(self._cgroup)
        if self._tty and os.isatty(self._stdio.fds[0]):  # sized while it waits: the command sees this terminal's size at once
            size = os.get_terminal_size(self._stdio.fds[0])
            docker.exec_resize(self._exec_id, size.lines, size.columns)
        os.kill(stub, signal.SIGCONT)
        self._stop_r, self._stop_w = os.pipe()
        # The engine's connection is the box's end of each stream: the relays hold copies of the fds a runtime
        # exec would have held, closed when they end (so a PIPE reader sees EOF then).
        self._relayed = [os.dup(fd) for fd in self._stdio.fds]
        self._relay = threading.Thread(target=self._relay_out, name=f"exec:{self.target.session}", daemon=True)
        self._relay.start()
        threading.Thread(target=self._relay_in, daemon=True).start()

    def _stopped_stub(self, docker: DockerBackend) -> int:
        """The engine's exec, by its host pid, once it has stopped itself."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pid = docker.exec_pid(self._exec_id)
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
        reader = self._sock.makefile("rb", buffering=relay.CHUNK)
        try:
            if self._tty:
                relay.copy(reader, relay.fd_sink(self._relayed[1]))
            else:
                relay.demux(reader, relay.fd_sink(self._relayed[1]), relay.fd_sink(self._relayed[2]))
        except OSError:
            pass
        finally:
            reader.close()
            os.close(self._relayed[1])
            os.close(self._relayed[2])

    # -- the subprocess-like surface ------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL the exec's whole process tree; the box stays up."""
        self._killed = True
        if self._cgroup is not None:
            self._cgroup.kill()
        elif self.target.backend != "docker":
            self._kill_in_gvisor()

    def _kill_in_gvisor(self) -> None:
        try:
            root = int(Path(self._pid_file).read_text())  # type: ignore[arg-type]
        except (OSError, ValueError, TypeError):
            self._proc.kill()
            return
        for pid in _descendants(self._runtime.argv("ps", self.target.container), root):
            subprocess.run(self._runtime.argv("kill", "--pid", str(pid), self.target.container, "KILL"), capture_output=True, timeout=10)

    def resize(self, rows: int, cols: int) -> None:
        """The command's terminal takes this size (on the engine; a runtime follows this terminal itself)."""
        if self._tty and self.target.backend == "docker":
            self._docker.exec_resize(self._exec_id, rows, cols)  # type: ignore[union-attr]

    def poll(self) -> int | None:
        if self.returncode is None and self._ended(0):
            return self.wait()
        return self.returncode

    def _ended(self, timeout: float | None) -> bool:
        if self.target.backend == "docker":
            self._relay.join(timeout)
            return not self._relay.is_alive()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        """Read the PIPEd stdout and stderr to their end in this thread, then wait, as Popen.communicate does; when
        `timeout` runs out the exec's tree is killed (so its outputs end) and `wait` says 124, rather than raise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        outputs = [stream for stream in (self.stdout, self.stderr) if stream is not None]
        named = [stream.fileno() if stream is not None else -1 for stream in (self.stdout, self.stderr)]
        got: dict[int, list[bytes]] = {fd: [] for fd in named if fd >= 0}
        poller = select.poll()
        for fd in got:
            poller.register(fd, select.POLLIN)
        open_fds = set(got)
        try:
            while open_fds:
                if deadline is not None and time.monotonic() >= deadline:
                    if self.timed_out:
                        break  # the grace ran out too: what is left of the outputs is given up
                    self.timed_out = True
                    self.kill()
                    deadline = time.monotonic() + KILLED_GRACE  # every process that held them is gone by then
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                for fd, _ in poller.poll(None if left is None else left * 1000):
                    data = os.read(fd, relay.CHUNK)
                    if data:
                        got[fd].append(data)
                    else:
                        poller.unregister(fd)
                        open_fds.discard(fd)
        except BaseException:
            self.kill()
            raise
        finally:
            for stream in outputs:
                stream.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        out, err = (b"".join(got.get(fd, [])) for fd in named)
        return out, err

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command to end (and its outputs to be drained); its exit status, 124 after a timeout
        (`timeout` here kills the exec's tree when it runs out, as quinebox.exec's does, rather than raise)."""
        if self.returncode is not None:
            return self.returncode
        try:
            if not self._ended(timeout):
                self.timed_out = True
                self.kill()
                self._ended(10)
        except BaseException:
            self.kill()
            raise
        with self._lock:
            if self.returncode is None:
                self.returncode = self._finish()
        return self.returncode

    def _finish(self) -> int:
        if self.target.backend == "docker":
            os.write(self._stop_w, b"x")
            self._sock.close()
            os.close(self._stop_w)
            code = self._docker.exec_exit_code(self._exec_id)  # type: ignore[union-attr]
            os.close(self._stop_r)
            code = EXIT_KILLED if code is None else code
        else:
            code = self._proc.returncode
            code = 128 - code if code < 0 else self._not_started(code)
            if self._pid_file:
                try:
                    os.unlink(self._pid_file)
                except OSError:
                    pass
        self._stdio.box_gone()  # its copy of stderr, for the host's diagnostics: the drain ends once it is closed too
        self._stdio.finish(10)
        if self._cgroup is not None:
            if self.timed_out or self._killed:
                self._cgroup.kill()
            self._cgroup.remove()
        if self._watchdog is not None:  # the exec ended while we lived: the watchdog leaves what it left running
            os.write(self._watchdog, b"x")
            os.close(self._watchdog)
        if self.timed_out:
            return EXIT_TIMEOUT
        return EXIT_KILLED if self._killed and code != 0 else code

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

    def busy(self) -> bool:
        """Does anything the exec started still run (in its cgroup)?"""
        return self._cgroup.busy() if self._cgroup is not None else self.returncode is None

    def __enter__(self) -> "BoxExec":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stdin:
            self.stdin.close()
        self.wait()


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
