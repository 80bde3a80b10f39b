"""A box on bubblewrap (run/launch.py's Launch): one bwrap process holding the caller's streams itself.

Its stdin, stdout and stderr are the caller's own fds (streams/direct.py), handed to bwrap, whose box holds them
with no relay between; with a terminal, a pty made here (os.openpty) whose slave is the box's 0, 1 and 2 and whose
master is relayed as a runtime's console is (streams/console.py). Its world and sockets are its user's host ids'
(a root-made box's own, or the caller's). No warm pool: a bwrap box starts in about the time a warm box is claimed.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import IO

from quinebox.box.backends.bwrap.box import BwrapProcess
from quinebox.box.backends.bwrap.configure import BwrapConfig, configure_bwrap
from quinebox.box.backends.oci import idmap
from quinebox.box.images.rootfs import in_rootfs
from quinebox.box.net.broker import Broker
from quinebox.box.net.secrets import rootfs_reader
from quinebox.box.run.ending import Ends
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo
from quinebox.box.streams import relay
from quinebox.box.streams.console import ConsoleRelay
from quinebox.box.streams.direct import DEVNULL, DirectStdio, Stream
from quinebox.errors import ImageError


class BwrapLaunch:
    """One box on bubblewrap, made here (no warm pool)."""

    claimed = None

    def __init__(self, ends: Ends):
        self.id: str | None = None
        self.stdin: relay.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.say: Callable[[bytes], None] | None = None
        self._ends = ends
        self._box: BwrapProcess | None = None
        self._direct: DirectStdio | None = None
        self._console: ConsoleRelay | None = None
        self._config: BwrapConfig | None = None
        self._session: str | None = None

    def configure(self, spec: BoxSpec, *, lasting: bool = False) -> tuple[BoxSpec, ImageInfo, BwrapConfig]:
        spec, image, config = configure_bwrap(spec, lasting=lasting)
        self._session, self._config = spec.session, config
        idmap.note(spec.session, config.ids)  # its children share them
        return spec, image, config

    def world_owner(self, spec: BoxSpec) -> tuple[int, int]:
        """The host ids bwrap runs as: the box's user is mapped onto them."""
        assert self._config is not None
        return self._config.box.host_ids

    def reader(self, config: BwrapConfig, image: str) -> Callable[[str], bytes]:
        return rootfs_reader(config.image_root)

    def claim(self, spec: BoxSpec, config: BwrapConfig, *, lasting: bool = False) -> socket.socket | None:
        """None: bwrap keeps no warm boxes."""
        return None

    def start(self, spec: BoxSpec, config: BwrapConfig, streams: tuple[Stream | bytes, Stream, Stream], *, broker: Broker | None, stop_fd: int) -> None:
        stdin, stdout, stderr = streams
        if spec.agent and spec.image != DEFAULT_IMAGE and not in_rootfs(config.image_root, "/bin/sh"):
            raise ImageError(f"image {spec.image} has no /bin/sh: an agent's sh tool runs the image's own shell; choose an image that has one")
        terminal: int | None = None
        if spec.tty:  # the box's terminal is a pty of ours: its slave the box's, its master relayed
            self._console = ConsoleRelay(stdin, stdout, stop_fd)
            self.stdin, self.stdout = self._console.stdin, self._console.stdout  # type: ignore[assignment]  # the console's own writer and reader serve as the box's
            stdin = stdout = DEVNULL
        self._direct = direct = DirectStdio(stdin, stdout, stderr)
        if not spec.tty:
            self.stdin, self.stdout = direct.stdin, direct.stdout  # type: ignore[assignment]  # raw pipe files, written and read as the relay's would be
        self.stderr, self.say = direct.stderr, direct.say
        master = None
        try:
            if self._console is not None:
                master, terminal = os.openpty()
                if config.ids is not None:  # the box's user owns its terminal, as a runtime's console is its
                    os.fchown(terminal, *config.box.host_ids)
            self._box = BwrapProcess(
                spec.session, config.box, labels=config.labels, image_root=config.image_root, cgroup_path=config.cgroup, ids=config.ids,
                stdio=direct.fds, ended=self._ended, terminal=terminal, command=spec.argv,
            )
        except BaseException:
            if master is not None:
                os.close(master)
            raise
        finally:
            if terminal is not None:
                os.close(terminal)
        if self._console is not None and master is not None:
            self._console.attach(master)
        self.id = self._box.id
        direct.started()

    def _ended(self, code: int, oom: bool, died: str | None) -> None:
        self._ends.exit(code, oom=oom, sandbox_died=died)
        if self._direct is not None:
            self._direct.box_gone()
        self._ends.end()

    def kill(self) -> None:
        if self._box is not None:
            self._box.kill()

    def signal(self, signum: int) -> None:
        if self._box is not None:
            self._box.signal(signum)

    @property
    def pid(self) -> int | None:
        return self._box.host_pid if self._box is not None else None

    def remove(self) -> None:
        if self._box is not None:
            self._box.remove()

    def resize(self, rows: int, cols: int) -> None:
        if self._console is not None:
            self._console.resize(rows, cols)

    def drain(self, grace: float) -> None:
        if self._direct is not None:
            self._direct.finish(grace)
        if self._console is not None:
            self._console.drain(grace)

    def close(self) -> None:
        if self._session is not None:
            idmap.note(self._session, None)
        if self._console is not None:
            self._console.close()

    def abandon(self) -> None:
        """A start that failed: a box made removed its ids with its remains; one never made gives them back here."""
        if self._box is None and self._config is not None and self._config.ids is not None and self._session is not None:
            idmap.release(self._config.ids, self._session)
        if self._session is not None:
            idmap.note(self._session, None)
        if self._direct is not None:
            self._direct.close()
