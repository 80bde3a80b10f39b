"""Entering a live box: one command run inside it (the engine's or the runtime's exec), as the box's user, within its limits.

To see what an agent sees: its /world, its processes, its tools. Only whoever
started a box may enter it; the command gets the box's own user, environment,
seccomp profile, capabilities (none) and cgroup, never more. It ends with the
box, whichever comes first.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import TYPE_CHECKING

from quinebox.box.streams import relay
from quinebox.box.backends.oci import say_unfiltered
from quinebox.box.backends.ocibox import oci_runtime
from quinebox.box.owners.listing import BoxInfo, live_boxes
from quinebox.errors import EngineError, QuineboxError
from quinebox.state import run_dir

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

#: The exit status when the engine cannot say how the command ended (the box was killed under it).
EXIT_LOST = 137


class Entered:
    """A command running in a live box, its streams wired to this process's stdin, stdout and stderr."""

    def __init__(self, backend: DockerBackend, box: BoxInfo, argv: list[str], *, tty: bool):
        self.session = box.session
        self._backend = backend
        self._tty = tty
        self._exec = backend.exec_create(box.container, argv, tty=tty)
        self._sock = backend.exec_start(self._exec, tty=tty)
        self._stop_r, self._stop_w = os.pipe()
        self._out = threading.Thread(target=self._relay, name=f"enter:{box.session}", daemon=True)
        self._out.start()
        threading.Thread(target=relay.pump_fd, args=(0, self._sock, self._stop_r), daemon=True).start()

    def _relay(self) -> None:
        reader = self._sock.makefile("rb", buffering=relay.CHUNK)
        try:
            if self._tty:
                relay.copy(reader, relay.fd_sink(1))
            else:
                relay.demux(reader, relay.fd_sink(1), relay.fd_sink(2))
        except OSError:
            pass
        finally:
            reader.close()

    def resize(self, rows: int, cols: int) -> None:
        self._backend.exec_resize(self._exec, rows, cols)

    def wait(self) -> int:
        self._out.join()
        os.write(self._stop_w, b"x")
        self._sock.close()
        code = self._backend.exec_exit_code(self._exec)
        return EXIT_LOST if code is None else code


class EnteredRuntime:
    """The same on an OCI runtime: its own `exec`, with this process's stdin, stdout and stderr (a terminal
    included: the runtime sizes the box's terminal after this one, now and on every SIGWINCH)."""

    def __init__(self, box: BoxInfo, argv: list[str], *, tty: bool):
        self.session = box.session
        runtime = oci_runtime(box.backend)
        try:
            process = json.loads((run_dir() / f"{box.session}.oci" / "config.json").read_text())["process"]
        except (OSError, ValueError, KeyError):
            raise EngineError(f"box {box.session} is going away: its bundle is gone") from None
        user = f"{process['user']['uid']}:{process['user']['gid']}"
        if runtime.gvisor:
            say_unfiltered(box.session)
        self._process = subprocess.Popen(runtime.exec_argv(box.container, argv, tty=tty, user=user, cwd=process.get("cwd")))

    def resize(self, rows: int, cols: int) -> None:
        pass  # the runtime follows this terminal's size itself

    def wait(self) -> int:
        return self._process.wait()


def find_box(session: str, boxes: list[BoxInfo]) -> BoxInfo:
    """The one live box whose session starts with `session`, if the caller started it."""
    matches = [box for box in boxes if box.session.startswith(session)]
    if len(matches) != 1:
        raise QuineboxError(f"no live box {session!r} (or more than one starts so): `quinebox ps` lists them")
    box = matches[0]
    if box.user != str(os.getuid()):
        raise QuineboxError(f"box {box.session} was started by another user (uid {box.user or 'unknown'}): only its owner may enter it")
    return box


def enter_box(session: str, argv: list[str], *, tty: bool, backend: DockerBackend | None = None) -> Entered | EnteredRuntime:
    box = find_box(session, live_boxes(backend))
    if box.backend != "docker":
        return EnteredRuntime(box, argv, tty=tty)
    from quinebox.box.backends.docker import DockerBackend

    return Entered(backend or DockerBackend.connect(), box, argv, tty=tty)
