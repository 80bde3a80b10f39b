"""One box on the Docker engine, as its listing shows it: a Box (boxes.py) whose every act is one engine request.

Its execs are the engine's: an engine exec cannot be placed, so it starts as a guest stub that stops itself; the
host moves the stopped stub into the exec's cgroup, then lets it become the command. Its streams come over the
engine's connection (relay.py). It pauses by the engine's pause (its kill and removal work on a paused box); it
has no user namespace of its own (its root is the host's), and quinebox takes no snapshot of it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quinebox.box.backends.boxes import Box, Capabilities, Way
from quinebox.box.backends.choice import ENGINE
from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.backends.exec_cgroups import EXIT_KILLED, ExecCgroup, cgroup_of, watchdog
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.streams import relay
from quinebox.errors import EngineError

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
#: The engine's boxes: paused by the engine; its processes are the host's; no user namespace, no snapshot.
CAPABILITIES = Capabilities(pause=True, checkpoint=False, own_user_namespace=False, host_processes=True, stdio_files=True)


def boxes(engine: DockerBackend) -> list[DockerBox]:
    """Every quinebox container on the engine, running or not, as the Box that owns it."""
    return [DockerBox(engine, entry) for entry in engine.containers()]


class DockerBox(Box):
    """A container of quinebox's, from one entry of the engine's container list."""

    backend = ENGINE
    label = "the Docker engine"
    image_root = ""
    capabilities = CAPABILITIES

    def __init__(self, engine: DockerBackend, entry: dict[str, Any]):
        self.engine = engine
        self.id: str = entry["Id"]
        self.labels: dict[str, str] = entry.get("Labels") or {}
        self.state: str = entry.get("State", "?")
        self.command: str = entry.get("Command", "")
        self.made: float = float(entry.get("Created") or 0)
        #: The host paths mounted into it (a guest runtime in use is one).
        self.mounts: list[str] = [m.get("Source", "") for m in entry.get("Mounts") or []]

    def kill(self, signal: str = "KILL") -> bool:
        return self.engine.kill(self.id, signal)

    def destroy(self) -> bool:
        return self.engine.remove(self.id)

    def process(self) -> tuple[str, str]:
        config = self.engine.container_config(self.id)
        return config.get("User") or "", config.get("WorkingDir") or "/"

    def why_not(self, capability: str) -> str:
        if capability == "own_user_namespace":
            return "a box on the Docker engine has no user namespace of its own"
        if capability == "checkpoint":
            try:
                experimental = self.engine.experimental()
            except EngineError:
                experimental = False
            if not experimental:
                return "whose checkpoints need its experimental mode (off here: `dockerd --experimental`) and CRIU"
            return "whose experimental checkpoints quinebox does not take (they go through CRIU, and a box's host socket with them)"
        return super().why_not(capability)

    def freeze(self) -> None:
        self.engine.pause(self.id)

    def thaw(self) -> None:
        self.engine.unpause(self.id)

    def exec_way(self, session: str, *, tty: bool, guard: bool) -> Way:
        return EngineWay(self, session, tty=tty, guard=guard)


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
