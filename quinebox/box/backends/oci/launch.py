"""A box on an OCI runtime (runc, runsc): it holds the caller's streams itself, and asks the engine nothing.

Its init's exit status and its cgroup are the authority on how it ended
(backends/oci/box.py tells both, and gVisor's sandbox death); with a terminal,
the runtime makes it and hands over its master, relayed as the engine's attach is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import IO, Any

from quinebox.box.backends.oci import idmap
from quinebox.box.backends.oci.box import OciBox, oci_runtime
from quinebox.box.backends.oci.claim import ClaimedOci, claim_oci
from quinebox.box.backends.oci.configure import configure_oci
from quinebox.box.images.rootfs import in_rootfs
from quinebox.box.net.broker import Broker
from quinebox.box.net.secrets import rootfs_reader
from quinebox.box.pool.claim import forget
from quinebox.box.run.ending import Ends
from quinebox.box.shape import oci_claim_frame
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo
from quinebox.box.streams import relay
from quinebox.box.streams.console import ConsoleRelay
from quinebox.box.streams.direct import DEVNULL, DirectStdio, Stream
from quinebox.errors import ImageError


class OciLaunch:
    """One box on the OCI runtime named `runtime`: made here, or a warm one claimed from the pool (oci/claim.py)."""

    def __init__(self, runtime: str, ends: Ends):
        self.runtime = oci_runtime(runtime)
        self.id: str | None = None
        self.stdin: relay.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.say: Callable[[bytes], None] | None = None
        self._ends = ends
        self._box: OciBox | None = None
        self._direct: DirectStdio | None = None
        self._console: ConsoleRelay | None = None
        #: The warm box this one is, when the pool had one of its shape.
        self.claimed: ClaimedOci | None = None
        #: A root-made box's own host ids (idmap.py), from its configuration until it is claimed warm or removed.
        self._ids: idmap.IdRange | None = None
        self._session: str | None = None

    def configure(self, spec: BoxSpec, *, lasting: bool = False) -> tuple[BoxSpec, ImageInfo, dict[str, Any]]:
        spec, image, config = configure_oci(spec, self.runtime.name, lasting=lasting)
        self._session = spec.session
        self._ids = idmap.range_of(config["linux"].get("uidMappings")) if os.geteuid() == 0 else None
        idmap.note(spec.session, self._ids)  # its children share them
        return spec, image, config

    def world_owner(self, spec: BoxSpec) -> tuple[int, int]:
        """A claimed warm box's user's, a root-made box's own ids' (idmap.py), or the caller's (rootless)."""
        if self.claimed is not None:
            return self.claimed.owner
        if self._ids is not None:
            return self._ids.host(spec.uid), self._ids.host(spec.gid)
        return spec.uid, spec.gid

    def reader(self, config: dict[str, Any], image: str) -> Callable[[str], bytes]:
        return rootfs_reader(config["root"]["path"])

    def claim(self, spec: BoxSpec, config: dict[str, Any], *, lasting: bool = False) -> socket.socket | None:
        """A warm box, but for a lasting one: the pool's keeper is a warm box's parent, and would stay as long as it."""
        self.claimed = None if lasting else claim_oci(spec, config, self.runtime.name)
        if self.claimed is None:
            return None
        self._release_ids(spec)  # the warm box has ids of its own
        idmap.note(spec.session, idmap.holding(self.claimed.owner[0]))
        self.claimed.settle(spec, config["process"])
        return self.claimed.listener

    def start(self, spec: BoxSpec, config: dict[str, Any], streams: tuple[Stream | bytes, Stream, Stream], *, broker: Broker | None, stop_fd: int) -> None:
        stdin, stdout, stderr = streams
        if spec.agent and spec.image != DEFAULT_IMAGE and not in_rootfs(config["root"]["path"], "/bin/sh"):
            raise ImageError(f"image {spec.image} has no /bin/sh: an agent's sh tool runs the image's own shell; choose an image that has one")
        if spec.tty:  # the runtime makes the terminal, and hands us its master: a relay, as the engine's attach is
            self._console = ConsoleRelay(stdin, stdout, stop_fd)
            self.stdin, self.stdout = self._console.stdin, self._console.stdout  # type: ignore[assignment]  # the console's own writer and reader serve as the box's
            stdin = stdout = DEVNULL
        self._direct = direct = DirectStdio(stdin, stdout, stderr, copy_files=not self.runtime.capabilities.stdio_files)
        if not spec.tty:
            self.stdin, self.stdout = direct.stdin, direct.stdout  # type: ignore[assignment]  # raw pipe files, written and read as the relay's would be
        self.stderr, self.say = direct.stderr, direct.say
        if self.claimed is not None:  # a warm box runs already: its init is given its command and the streams
            self.id = self.claimed.container
            self.claimed.start(oci_claim_frame(config), direct.fds, broker, self._ended)
            direct.started()
            return
        self._box = OciBox(
            self.runtime, spec.session, config, stdio=direct.fds, ended=self._ended, console=self._console.attach if self._console else None,
        )
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
        elif self.claimed is not None:
            self.claimed.kill()

    def signal(self, signum: int) -> None:
        if self._box is not None:
            self._box.signal(signum)
        elif self.claimed is not None:
            self.claimed.signal(signum)

    @property
    def pid(self) -> int | None:
        return self._box.host_pid if self._box is not None else None

    def remove(self) -> None:
        """The box's remains removed: a claimed one's by the pool's keeper, which made it, once it has ended."""
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
        if self.claimed is not None:
            forget(self.claimed.container)

    def _release_ids(self, spec: BoxSpec) -> None:
        if self._ids is not None:
            idmap.release(self._ids, spec.session)
            self._ids = None

    def abandon(self) -> None:
        """A start that failed: a box made removes its ids with its remains (boxroot.remove_bundle); one never
        made gives them back here."""
        if self._box is None and self._ids is not None and self._session is not None:
            idmap.release(self._ids, self._session)
        if self._session is not None:
            idmap.note(self._session, None)
        if self._direct is not None:
            self._direct.close()
        if self.claimed is not None:
            self.claimed.release()
            forget(self.claimed.container)
