"""What starting a box on one backend takes, behind one interface (each backend's is made by its seam.Backend).

A box's backend is chosen once (backends/choice.py); from then on `BoxProcess`
asks its `Launch` and never which backend it is on: to configure the box, to
read files of its image (for secrets), to claim a warm one, to start it with
its streams, and to kill, resize, drain, close or abandon it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Protocol

from quinebox.box.spec import BoxSpec
from quinebox.box.streams.direct import Stream

if TYPE_CHECKING:
    from quinebox.box.backends.oci.claim import ClaimedOci
    from quinebox.box.net.broker import Broker
    from quinebox.box.pool.claim import Claimed
    from quinebox.box.spec import ImageInfo
    from quinebox.box.streams import relay


class Launch(Protocol):
    """One box on one backend. `id`, the streams and `say` are there once `start` returned."""

    id: str | None
    stdin: relay.StdinWriter | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    #: The host's diagnostics about the box, into the box's stderr; None before the streams are connected.
    say: Callable[[bytes], None] | None

    @property
    def claimed(self) -> Claimed | ClaimedOci | None:
        """The warm box this one is, when the pool had one of its shape."""

    def configure(self, spec: BoxSpec, *, lasting: bool = False) -> tuple[BoxSpec, ImageInfo, Any]:
        """(the spec with its argv filled in, its image, the backend's configuration of the box). `lasting`: the box
        stays up until its owner removes it (a Sandbox), its init starting execs beside its command."""

    def reader(self, config: Any, image: str) -> Callable[[str], bytes]:
        """What reads a file of the box's image (secrets.py's `prepare_secrets` takes it)."""

    def claim(self, spec: BoxSpec, config: Any, *, lasting: bool = False) -> Any:
        """A warm box claimed for `spec` if the backend keeps any; the lifeline's listener it hands over, or None.
        `lasting`: a box that stays up until its owner removes it (a Sandbox), which a backend may always make itself."""

    def world_owner(self, spec: BoxSpec) -> tuple[int, int]:
        """The host's (uid, gid) of the box's user, once claimed or not: its world and sockets are theirs (a
        root-made box's own ids on a runtime, backends/oci/idmap.py; `spec.uid` where no namespace maps it)."""

    def start(self, spec: BoxSpec, config: Any, streams: tuple[Stream | bytes, Stream, Stream], *, broker: Broker | None, stop_fd: int) -> None:
        """The box made and started, its streams connected; its end is told to the `Ends` the launch was given."""

    def kill(self) -> None: ...

    def signal(self, signum: int) -> None:
        """`signum` to the box's init, which passes SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to its
        command (guest/lifeline.py); nothing once the box has ended."""

    @property
    def pid(self) -> int | None:
        """The box's init's process id as the host sees it; None where the host has none to give (gVisor's kernel
        holds it, the engine's or the pool's box)."""

    def remove(self) -> None: ...

    def resize(self, rows: int, cols: int) -> None: ...

    def drain(self, grace: float) -> None:
        """Wait, at most `grace` seconds each, until the box's output is all delivered."""

    def close(self) -> None:
        """Let go of the box's streams and of what followed it (after its stdin pump was told to stop)."""

    def abandon(self) -> None:
        """A start that failed: release what the launch took, the box included."""
