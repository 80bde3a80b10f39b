"""One running box, from a resolved spec: the low-level layer under `quinebox.Popen`.

A box's start, in named steps: the spec checked and configured for the
backend chosen (its `Launch`, box/run/launch.py, the one place that knows
which backend it is), its way out, then its lifeline, its world, its place, the
box started with its streams and its deadline. Then streams flow until the
backend says the box is gone; how it ended is one `Ending` (box/run/ending.py),
from which its returncode and every flag below are read.

A box knows nothing of the tree it may belong to: whoever starts it hands it
a `Place` (tree.Node), which starts the box's children and hears when the box
has its world and when it is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Protocol

from quinebox.audit.approvals import Decision
from quinebox.box.backends import watch
from quinebox.box.backends.choice import ENGINE, Choice, choose
from quinebox.box.backends.registry import NAMES, launch_for
from quinebox.box.live.execs import Process
from quinebox.box.net.broker import Broker, Handler, Spawner
from quinebox.box.net.egress import Egress
from quinebox.box.net.init_line import InitLine
from quinebox.box.net.secrets import prepare_secrets
from quinebox.box.policy import DEFAULT_WORLD, oci_refusal, proxied
from quinebox.box.run.ending import Ending, Ends, How
from quinebox.box.spec import BoxSpec
from quinebox.box.streams import relay
from quinebox.box.streams.direct import DEVNULL, PIPE, Stream  # noqa: F401 - PIPE and DEVNULL are taken from here, as from subprocess
from quinebox.errors import EXIT_QUINEBOX, EngineError
from quinebox.worlds.build import discard
from quinebox.worlds.world import World, end_world, open_world

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.backends.oci.claim import ClaimedOci
    from quinebox.box.pool.claim import Claimed

#: How long the engine may take to remove a box after it stopped before we insist.
REMOVAL_GRACE = 10.0


class Place(Spawner, Protocol):
    """A box's place in a process tree (tree.Node): it starts the box's children and follows the box.

    `attach` comes once the box's world is open and before the box starts, so
    the place has the world before the box can ask for a child; `ended` comes
    once the box is gone, its world closed and its returncode set. `approve`
    puts to a person what the box asked for and only an ask rule covers.
    """

    def attach(self, box: BoxProcess) -> None: ...
    def ended(self, box: BoxProcess) -> None: ...
    def approve(self, kind: str, subject: str, facts: dict[str, Any]) -> Decision: ...


class BoxProcess(Process):
    """A box running one command, with its streams connected like subprocess.Popen's, and its meaning (Process):
    `wait(timeout)` raises subprocess.TimeoutExpired and leaves the box running; `terminate` is SIGTERM to the
    command (the box's init passes it on), then SIGKILL after the grace; `kill` is SIGKILL to everything in it.

    stdin, stdout, stderr: None inherits this process's fd 0/1/2; PIPE gives
    `.stdin` (write, close() for EOF) / `.stdout` / `.stderr` (read); DEVNULL;
    a file descriptor or file object; for stdout/stderr also a callable that
    receives each chunk as it arrives. `handler` serves an agent's frames;
    without a `place` the box may not start boxes. `lasting`: the box stays up
    until its owner removes it (a Sandbox's).
    """

    def __init__(
        self,
        spec: BoxSpec,
        *,
        stdin: Stream | bytes = None,
        stdout: Stream = None,
        stderr: Stream = None,
        backend: DockerBackend | None = None,
        handler: Handler | None = None,
        place: Place | None = None,
        lasting: bool = False,
    ):
        self.session = spec.session
        self.place = place
        self._lasting = lasting
        self._handler = handler
        self.returncode: int | None = None
        #: How the box ended, once `wait` has seen it end: the one source of its returncode and termination.
        self.ending: Ending | None = None
        self._ends = Ends()
        self.stdin: relay.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        #: The box's world while it runs: the host side of its /world.
        self.world: World | None = None
        self._deadline: threading.Timer | None = None
        self._deadline_at = 0.0
        self._deadline_left: float | None = None  # while its clock is held
        self._broker: Broker | None = None
        self._closed = False
        self._finishing = threading.Lock()
        #: Where the box runs, and why there (`--verbose` and `doctor` say it).
        self.choice = (Choice(ENGINE, None, "a Docker backend was handed over") if backend
                       else choose(oci_refusal(spec), known=NAMES, backend=spec.backend, runtime=spec.runtime, spec=spec, lasting=lasting))
        self._launch = launch_for(self.choice, backend, self._ends, session=self.session, reader_gone=self._reader_gone)
        self.spec, image, config = self._launch.configure(spec, lasting=lasting)
        self.args = self.spec.argv
        self.image_id = image.id
        self._egress_proxy: Egress | None = None
        try:  # what configure took (a root-made box's host ids) goes back if the way out cannot be made
            self._egress_proxy = self._egress(handler, image.id or self.spec.image, self._launch.reader(config, image.id or self.spec.image)) if proxied(self.spec) else None
            self._stop_r, self._stop_w = os.pipe()  # only now: a box refused above holds nothing to release
        except BaseException:
            if self._egress_proxy is not None:
                self._egress_proxy.close()
            self._launch.abandon()
            raise
        try:
            self._start(config, (stdin, stdout, stderr))
        except BaseException as exc:
            self._abandon(exc)
            raise

    def _start(self, config: Any, streams: tuple[Stream | bytes, Stream, Stream]) -> None:
        """Lifeline, world, place, the box started on its backend, its deadline set: in this order."""
        spec = self.spec
        listener = self._launch.claim(spec, config, lasting=self._lasting)
        owner = self._launch.world_owner(spec)  # the host's ids of the box's user: its sockets and world are theirs
        self._broker = Broker(spec.lifeline, self._handler, self.place, listener=listener, owner=owner) if spec.lifeline else None
        if spec.world is not None:
            self.world = open_world(spec.session, spec.world, uid=owner[0], gid=owner[1], limit=spec.grants.world or DEFAULT_WORLD, on_full=self._world_full)
        if self.place is not None:
            self.place.attach(self)
        self._launch.start(spec, config, streams, broker=self._broker, stop_fd=self._stop_r)
        if self._ends.caused and not self._ends.exited.is_set():
            # A cause that came while the box was starting (its world over its grant within its first milliseconds)
            # found no box id to kill (_end_for): the box runs already, so it is killed now.
            self._launch.kill()
        launch = self._launch
        self.stdin, self.stdout, self.stderr = launch.stdin, launch.stdout, launch.stderr
        self.started = time.monotonic()
        if spec.grants.time:
            self._set_deadline(spec.grants.time)

    def _set_deadline(self, seconds: float) -> None:
        self._deadline_at = time.monotonic() + seconds
        self._deadline = threading.Timer(seconds, self._end_for, (How.TIMED_OUT,))
        self._deadline.daemon = True
        self._deadline.start()

    def hold_deadline(self) -> None:
        """Stop the clock of the box's time limit, as while it is paused; `release_deadline` starts it again
        with what was left of it."""
        if self._deadline is not None and self._deadline_left is None:
            self._deadline.cancel()
            self._deadline_left = max(0.0, self._deadline_at - time.monotonic())

    def release_deadline(self) -> None:
        if self._deadline_left is not None and not self._closed:
            left, self._deadline_left = self._deadline_left, None
            self._set_deadline(left)

    def _abandon(self, exc: BaseException) -> None:
        """A start that failed leaves nothing behind: no claim, no box, no world; a backend's failure is an incident,
        which names the backend unless it is the engine (doctor says whose it was)."""
        if isinstance(exc, EngineError):
            where = {} if self.choice.engine else {"backend": self.choice.where}
            watch.record_incident(str(exc), session=self.session, **where)
        # Its place may hold it already (a child attached before its runtime refused it): whoever waits on it, as
        # the tree's end does for every box in it, is answered at once, never left waiting for a box that never ran.
        self.returncode = EXIT_QUINEBOX
        self._launch.abandon()
        self._close()
        self._end_world(started=False)

    @property
    def id(self) -> str | None:
        """The box's container id on its backend, once it was made."""
        return self._launch.id

    def init_line(self, timeout: float) -> InitLine | None:
        """The box's init over its lifeline, which starts execs in the box (net/init_line.py), once it has said
        so (within `timeout` seconds of its start); None when it does not serve them (an agent's box, an image
        of an older quinebox's) or the box has ended."""
        if self._broker is None or not self._broker.init_said.wait(timeout):
            return None
        return self._broker.init

    @property
    def claimed(self) -> Claimed | ClaimedOci | None:
        """The warm box this one is, when the pool had one of its shape (box/pool/claim.py); else it was made here."""
        return self._launch.claimed

    @property
    def broker(self) -> Broker | None:
        """The host end of the box's socket (its lifeline), while the box runs."""
        return self._broker

    @property
    def _backend(self) -> DockerBackend | None:
        """The engine the box runs on, if it runs on one (sandbox.py runs its execs there)."""
        return getattr(self._launch, "backend", None)

    # -- how it ended (run/ending.py): each flag of the subprocess-like surface is read from the one ending -------

    @property
    def timed_out(self) -> bool:
        return self._ends.now().how is How.TIMED_OUT

    @property
    def oom_killed(self) -> bool:
        return self._ends.now().oom

    @property
    def broken_pipe(self) -> bool:
        """The reader of the box's output went away, so the box was stopped, as SIGPIPE would stop a process."""
        return self._ends.now().how is How.READER_GONE

    @property
    def world_full(self) -> str | None:
        """Why the host killed the box for its world (it grew past its world:SIZE grant), if it did."""
        return self._ends.now().said(How.WORLD_FULL)

    @property
    def engine_lost(self) -> str | None:
        """Why the box's wait ended without the engine: it stopped answering, or went away, while the box ran."""
        return self._ends.now().said(How.ENGINE_LOST)

    @property
    def sandbox_died(self) -> str | None:
        """Why the box's sandbox itself died (gVisor's kernel), if it did: the box was killed with it."""
        return self._ends.now().said(How.SANDBOX_DIED)

    # -- wiring -----------------------------------------------------------------

    def _egress(self, handler: Handler | None, image: str, read: Callable[[str], bytes]) -> Egress:
        """The box's way out; with secrets, its own authority, trusted by the box through the files in its tls_dir."""
        secrets, authority = prepare_secrets(self.session, self.spec.grants.secrets, self.spec.tls_dir, read, image)
        egress = Egress(
            self.spec.grants.net, say=self._say, session=self.session, record=handler.record_egress if handler else None, secrets=secrets, authority=authority,
            asks=self.spec.asks, approve=self.place.approve if self.place else None,
        )
        egress.listen(self.spec.egress_socket or "", self._launch.world_owner(self.spec))
        return egress

    def _reader_gone(self) -> None:
        # Not from this thread: the engine finishes a kill only after the box's output is drained, and this thread is the drain.
        threading.Thread(target=self._end_for, args=(How.READER_GONE,), daemon=True).start()

    def _say(self, line: str) -> None:
        """One diagnostic line from the host about this box, into the box's stderr."""
        if self._launch.say is not None:
            self._launch.say(f"quinebox: {line}\n".encode(errors="replace"))

    def _world_full(self, message: str) -> None:
        self._end_for(How.WORLD_FULL, message)

    def _end_for(self, how: How, reason: str | None = None) -> None:
        """The host ends the box for `how`, the first such cause its ending's: killed if it still runs.

        A cause that comes after the box's exit, before its wait settled, still counts (its time ran
        out, or its reader left while its output was drained), as it did when each was a flag."""
        self._ends.cause(how, reason)
        if self._launch.id and not self._ends.exited.is_set():
            self._launch.kill()

    def _end_world(self, *, started: bool = True) -> None:
        """The world's last revision; a box that never started leaves no world, a command's unused world is removed."""
        world, self.world = self.world, None
        if world is None:
            return
        if started:
            end_world(world, keep_unused=self.spec.agent)
        else:
            world.close()
            if world.made:  # a resumed session's world stays for its next resume
                discard(self.session)

    # -- the subprocess-like surface ---------------------------------------------

    def resize(self, rows: int, cols: int) -> None:
        """The box's terminal takes this size (with a tty only)."""
        if self.spec.tty:
            self._launch.resize(rows, cols)

    def kill(self) -> None:
        """SIGKILL everything in the box; the engine then removes it."""
        if self._launch.id and not self._ends.exited.is_set():
            self._end_for(How.KILLED)

    def send_signal(self, sig: int) -> None:
        """`sig` to the box's command: its init (guest/lifeline.py) passes on SIGTERM, SIGINT, SIGHUP, SIGQUIT,
        SIGUSR1 and SIGUSR2; SIGKILL is `kill`'s. Nothing once the box has ended."""
        if sig == signal.SIGKILL:
            self.kill()
        elif self._launch.id and not self._ends.exited.is_set():
            self._launch.signal(sig)

    @property
    def pid(self) -> int | None:
        """The box's init's process id as the host sees it (the command is its child); None where the host has
        none to give (gVisor, the engine, a box from the warm pool)."""
        return self._launch.pid

    def poll(self) -> int | None:
        if self.returncode is None and self._ends.gone.is_set():
            return self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the box to exit and be removed; return its exit status. subprocess.TimeoutExpired once
        `timeout` passes, the box left running (its own time limit is its `timeout:` grant, which kills it).

        Any other exception here (KeyboardInterrupt included) kills the box first,
        so no box outlives the call that was waiting for it.
        """
        if self.returncode is not None:
            return self.returncode
        limit = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._ends.exited.wait(0.05 if limit is None else max(0.0, min(0.05, limit - time.monotonic()))):
                if limit is not None and time.monotonic() >= limit:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._launch.drain(REMOVAL_GRACE)
            if not self._ends.gone.wait(REMOVAL_GRACE):
                self._launch.remove()
        except subprocess.TimeoutExpired:
            raise
        except BaseException:
            self.kill()
            if not self._ends.gone.wait(REMOVAL_GRACE):
                self._launch.remove()
            self._close()
            raise
        with self._finishing:  # a parent's node and the tree's end may wait on one box at once
            if self.returncode is None:
                self._close()
                self._end_world()
                self.ending = self._ends.settle()
                self.returncode = self.ending.code
                if self.place is not None:
                    self.place.ended(self)
        return self.returncode

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._deadline:
            self._deadline.cancel()
        os.write(self._stop_w, b"x")
        self._launch.close()
        os.close(self._stop_w)
        os.close(self._stop_r)
        for closer in (self._broker, self._egress_proxy):
            if closer is not None:
                try:
                    closer.close()
                except OSError:
                    pass
        if self.spec.tls_dir:
            shutil.rmtree(self.spec.tls_dir, ignore_errors=True)

