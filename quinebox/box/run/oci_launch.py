"""A box on an OCI runtime (runc, runsc): it holds the caller's streams itself, and asks the engine nothing.

Its init's exit status and its cgroup are the authority on how it ended
(backends/ocibox.py tells both, and gVisor's sandbox death); with a terminal,
the runtime makes it and hands over its master, relayed as the engine's attach is.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import IO, Any

from quinebox.box.backends.ocibox import OciBox, oci_runtime
from quinebox.box.configure import configure_oci
from quinebox.box.images.rootfs import in_rootfs
from quinebox.box.net.broker import Broker
from quinebox.box.net.secrets import rootfs_reader
from quinebox.box.pool.claim import forget
from quinebox.box.pool.claim_oci import ClaimedOci, claim_oci
from quinebox.box.run.ending import Ends
from quinebox.box.shape import oci_claim_frame
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo
from quinebox.box.streams import relay
from quinebox.box.streams.console import ConsoleRelay
from quinebox.box.streams.direct import DEVNULL, DirectStdio, Stream
from quinebox.errors import ImageError


class OciLaunch:
    """One box on the OCI runtime named `runtime`: made here, or a warm one claimed from the pool (claim_oci.py)."""

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

    def configure(self, spec: BoxSpec) -> tuple[BoxSpec, ImageInfo, dict[str, Any]]:
        return configure_oci(spec, self.runtime.name)

    def reader(self, config: dict[str, Any], image: str) -> Callable[[str], bytes]:
        return rootfs_reader(config["root"]["path"])

    def claim(self, spec: BoxSpec, config: dict[str, Any], *, lasting: bool = False) -> socket.socket | None:
        """A warm box, but for a lasting one: the pool's keeper is a warm box's parent, and would stay as long as it."""
        self.claimed = None if lasting else claim_oci(spec, config, self.runtime.name)
        if self.claimed is None:
            return None
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
        self._direct = direct = DirectStdio(stdin, stdout, stderr, copy_files=self.runtime.gvisor)
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
        if self._console is not None:
            self._console.close()
        if self.claimed is not None:
            forget(self.claimed.container)

    def abandon(self) -> None:
        if self._direct is not None:
            self._direct.close()
        if self.claimed is not None:
            self.claimed.release()
            forget(self.claimed.container)
