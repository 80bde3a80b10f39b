"""One running box, from a resolved spec: the low-level layer under `quinebox.Popen`.

A box's lifetime, in order: spec (checked), policy (pure), lifeline socket,
create, subscribe to its events, attach, start; then streams flow until the
engine reports `die` (with the exit code) and `destroy` (the box is gone).
The engine's events, not the box, are the authority on exit code and OOM.
On an OCI runtime (backends/ocibox.py) the box holds the caller's streams
itself (direct.py), and its init's exit status and its cgroup are the authority.

A box knows nothing of the tree it may belong to: whoever starts it hands it
a `Place` (tree.Node), which starts the box's children and hears when the box
has its world and when it is gone.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Protocol

from quinebox.audit.approvals import Decision
from quinebox.box.streams import relay
from quinebox.box.backends import watch
from quinebox.box.streams.attached import AttachedStdio
from quinebox.box.backends.choice import Choice, choose
from quinebox.box.backends.ocibox import OciBox, oci_runtime
from quinebox.box.net.broker import Broker, Handler, Spawner
from quinebox.box.pool.claim import claim, forget
from quinebox.box.streams.console import ConsoleRelay
from quinebox.box.configure import configure, configure_oci
from quinebox.box.streams.direct import DEVNULL, PIPE, DirectStdio, Stream  # noqa: F401 - PIPE is taken from here, as from subprocess
from quinebox.box.net.egress import Egress
from quinebox.box.policy import DEFAULT_WORLD, oci_refusal, proxied
from quinebox.box.images.rootfs import in_rootfs
from quinebox.box.net.secrets import engine_reader, prepare_secrets, rootfs_reader
from quinebox.box.shape import claim_frame
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec
from quinebox.errors import EXIT_QUINEBOX, EngineError, ImageError
from quinebox.worlds.build import discard
from quinebox.worlds.world import World, end_world, open_world

if TYPE_CHECKING:
    from quinebox.box.backends.docker import DockerBackend

EXIT_TIMEOUT = 124
#: How long the engine may take to remove a box after it stopped before we insist.
REMOVAL_GRACE = 10.0


class Place(Spawner, Protocol):
    """A box's place in a process tree (tree.Node): it starts the box's children and follows the box.

    `attach` comes once the box's world is open and before the box starts, so
    the place has the world before the box can ask for a child; `ended` comes
    once the box is gone, its world closed and its returncode set. `approve`
    puts to a person what the box asked for and only an ask rule covers.
    """

    def attach(self, box: "BoxProcess") -> None: ...
    def ended(self, box: "BoxProcess") -> None: ...
    def approve(self, kind: str, subject: str, facts: dict[str, Any]) -> Decision: ...


class BoxProcess:
    """A box running one command, with its streams connected like subprocess.Popen's.

    stdin, stdout, stderr: None inherits this process's fd 0/1/2; PIPE gives
    `.stdin` (write, close() for EOF) / `.stdout` / `.stderr` (read); DEVNULL;
    a file descriptor or file object; for stdout/stderr also a callable that
    receives each chunk as it arrives. `handler` serves an agent's frames;
    without a `place` the box may not start boxes.
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
    ):
        self.session = spec.session
        self.returncode: int | None = None
        self.timed_out = False
        self.oom_killed = False
        self.stdin: relay.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.id: str | None = None
        self._exit_code: int | None = None
        self._died = threading.Event()
        self._destroyed = threading.Event()
        self._attached: AttachedStdio | None = None
        self._deadline: threading.Timer | None = None
        self._closed = False
        self._killing = False  # a kill event is ours, not the engine's own
        self._err: relay.Sink | None = None
        self._finishing = threading.Lock()
        #: Why the host killed the box for its world (it grew past its world:SIZE grant), if it did.
        self.world_full: str | None = None
        #: Why the box's wait ended without the engine: it stopped answering, or went away, while the box ran.
        self.engine_lost: str | None = None
        #: Why the box's sandbox itself died (gVisor's kernel), if it did: the box was killed with it.
        self.sandbox_died: str | None = None
        self._watch: tuple[watch.EngineWatch, int] | None = None
        #: The box's world while it runs: the host side of its /world.
        self.world: World | None = None
        self.place = place
        self._oci: OciBox | None = None
        self._direct: DirectStdio | None = None
        self._console: ConsoleRelay | None = None

        #: Where the box runs, and why there (`--verbose` and `doctor` say it).
        self.choice = Choice("docker", None, "a Docker backend was handed over") if backend else choose(oci_refusal(spec), backend=spec.backend, runtime=spec.runtime)
        if self.choice.backend == "oci":
            self.spec, image, config = configure_oci(spec, oci_runtime(self.choice.runtime or "runc").name)
        else:
            from quinebox.box.backends.docker import DockerBackend

            self._backend = backend or DockerBackend.shared()
            self.spec, image, config = configure(spec, self._backend)
        spec = self.spec
        self.args = spec.argv
        self.image_id = image.id
        oci = self.choice.backend == "oci"
        read = rootfs_reader(config["root"]["path"]) if oci else engine_reader(self._backend, image.id or spec.image)
        egress = self._egress(handler, image.id or spec.image, read) if proxied(spec) else None
        self._stop_r, self._stop_w = os.pipe()  # only now: a box refused above holds nothing to release
        #: The warm box this one is, when the pool had one of its shape (box/pool/claim.py); else it is made here.
        self.claimed = None if oci else claim(spec, config, self._backend)
        self._egress_proxy = egress
        self._broker: Broker | None = None
        try:
            if self.claimed is not None:
                self.claimed.settle(spec, config.create["command"])
            listener = self.claimed.listener if self.claimed else None
            self._broker = Broker(spec.lifeline, handler, place, listener=listener) if spec.lifeline else None
            if self.spec.world is not None:
                self.world = open_world(
                    spec.session, spec.world, uid=spec.uid, gid=spec.gid, limit=spec.grants.world or DEFAULT_WORLD, on_full=self._world_full
                )
            if place is not None:
                place.attach(self)
            if self.choice.backend == "oci":
                self._start_oci(config, stdin, stdout, stderr)
            else:
                self._start_docker(spec, config, stdin, stdout, stderr)
            if self.spec.grants.time:
                self._deadline = threading.Timer(self.spec.grants.time, self._expire)
                self._deadline.daemon = True
                self._deadline.start()
        except BaseException as exc:
            if isinstance(exc, EngineError):
                watch.record_incident(str(exc), session=self.session)
            if self.claimed is not None:
                self.claimed.release()
            if self._direct is not None:
                self._direct.close()
            if self.id and self._oci is None:
                self._backend.remove(self.id)  # if the engine does not answer, `quinebox gc` removes it once it does
            self._close()
            self._end_world(started=False)
            raise

    def _start_oci(self, config: dict[str, Any], stdin: Stream | bytes, stdout: Stream, stderr: Stream) -> None:
        """The box made and started on its runtime, holding the streams itself; the engine is not asked anything."""
        if self.spec.agent and self.spec.image != DEFAULT_IMAGE and not in_rootfs(config["root"]["path"], "/bin/sh"):
            raise ImageError(f"image {self.spec.image} has no /bin/sh: an agent's sh tool runs the image's own shell; choose an image that has one")
        if self.spec.tty:  # the runtime makes the terminal, and hands us its master: a relay, as the engine's attach is
            self._console = ConsoleRelay(stdin, stdout, self._stop_r)
            self.stdin, self.stdout = self._console.stdin, self._console.stdout  # type: ignore[assignment]
            stdin = stdout = DEVNULL
        self._direct = direct = DirectStdio(stdin, stdout, stderr)
        if not self.spec.tty:
            self.stdin, self.stdout = direct.stdin, direct.stdout  # type: ignore[assignment]
        self.stderr, self._err = direct.stderr, direct.say
        self._oci = OciBox(
            oci_runtime(self.choice.runtime or "runc"), self.session, config, stdio=direct.fds, ended=self._oci_ended,
            console=self._console.attach if self._console else None,
        )
        self.id = self._oci.id
        direct.started()
        self.started = time.monotonic()

    def _oci_ended(self, code: int, oom: bool, died: str | None) -> None:
        self._exit_code, self.oom_killed, self.sandbox_died = code, oom, died
        if self._direct is not None:
            self._direct.box_gone()
        self._died.set()
        self._destroyed.set()

    def _start_docker(self, spec: BoxSpec, config: Any, stdin: Stream | bytes, stdout: Stream, stderr: Stream) -> None:
        """The box created (or a warm one claimed) on the engine, its events followed, its streams attached, started."""
        self.id = self.claimed.container if self.claimed else self._backend.create(config)
        if spec.agent and spec.image != DEFAULT_IMAGE and not (self.claimed.shell if self.claimed else self._backend.exists(self.id, "/bin/sh")):
            raise ImageError(f"image {spec.image} has no /bin/sh: an agent's sh tool runs the image's own shell; choose an image that has one")
        self._events = self._backend.events(self.id)
        self._spawn(self._follow_events, "events")
        self._sock = self.claimed.attach if self.claimed else self._backend.attach(self.id)
        self._attached = attached = AttachedStdio(self._sock, stdout, stderr, tty=spec.tty, broken=self._reader_gone, name=self.session)
        self.stdout, self.stderr, self._err = attached.stdout, attached.stderr, attached.err
        if self.claimed is None:
            self._backend.start(self.id)
        else:  # a warm box runs already: its claim tells it what to run, as a cold box's config would have
            self.claimed.start(claim_frame(spec, config), self._broker)
        self.started = time.monotonic()
        self._watch = watch.watch(self._backend, self._lose_engine)
        attached.connect_stdin(stdin, self._stop_r)
        self.stdin = attached.stdin

    # -- wiring -----------------------------------------------------------------

    def _egress(self, handler: Handler | None, image: str, read: Callable[[str], bytes]) -> Egress:
        """The box's way out; with secrets, its own authority, trusted by the box through the files in its tls_dir."""
        secrets, authority = prepare_secrets(self.session, self.spec.grants.secrets, self.spec.tls_dir, read, image)
        egress = Egress(
            self.spec.grants.net, say=self._say, session=self.session, record=handler.record_egress if handler else None, secrets=secrets, authority=authority,
            asks=self.spec.asks, approve=self.place.approve if self.place else None,
        )
        egress.listen(self.spec.egress_socket or "")
        return egress

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"{name}:{self.session}", daemon=True)
        thread.start()
        return thread

    def _reader_gone(self) -> None:
        self.broken_pipe = True
        # Not from this thread: the engine finishes a kill only after the box's output is drained, and this thread is the drain.
        threading.Thread(target=self.kill, daemon=True).start()

    broken_pipe = False

    def _follow_events(self) -> None:
        destroyed = outside = False
        try:
            for event in self._events:
                action = event.get("Action") or event.get("status")
                if action == "oom":
                    self.oom_killed = True
                elif action == "kill" and not self._killing:
                    outside = True
                elif action == "die":
                    self._exit_code = int(event.get("Actor", {}).get("Attributes", {}).get("exitCode", 137))
                    self._died.set()
                elif action == "destroy":
                    destroyed = True
                    break
        except Exception:
            pass  # the engine closed the stream
        finally:
            if not self._closed and watch.engine_went_away(self._backend, died=self._died.is_set(), destroyed=destroyed, outside=outside):
                self.engine_lost = self.engine_lost or "the Docker engine went away while the box ran (it stopped or restarted)"
                watch.record_incident(f"box {self.session} given up: its event stream ended before it did", session=self.session)
            self._died.set()
            self._destroyed.set()

    def _lose_engine(self, reason: str) -> None:
        """The engine stopped answering: end the wait now; the box dies once its lifeline is let go."""
        if not self._died.is_set() and not self._closed:
            self.engine_lost = reason
            self._died.set()
            self._destroyed.set()

    def _say(self, line: str) -> None:
        """One diagnostic line from the host about this box, into the box's stderr."""
        if self._err is not None:
            self._err(f"quinebox: {line}\n".encode(errors="replace"))

    def _expire(self) -> None:
        self.timed_out = True
        self.kill()

    def _world_full(self, message: str) -> None:
        self.world_full = message
        self.kill()

    def _end_world(self, *, started: bool = True) -> None:
        """The world's last revision; a box that never started leaves no world, a command's unused world is removed."""
        world, self.world = self.world, None
        if world is None:
            return
        if started:
            end_world(world, keep_unused=self.spec.agent)
        else:
            world.close()
            discard(self.session)

    # -- the subprocess-like surface ---------------------------------------------

    def resize(self, rows: int, cols: int) -> None:
        """The box's terminal takes this size (with a tty only)."""
        if self._console is not None:
            self._console.resize(rows, cols)
        elif self.id and self.spec.tty and not self._died.is_set():
            self._backend.resize(self.id, rows, cols)

    def kill(self) -> None:
        """SIGKILL everything in the box; the engine then removes it."""
        if self.id and not self._died.is_set():
            self._killing = True
            self._oci.kill() if self._oci else self._backend.kill(self.id)

    terminate = kill

    def _remove(self) -> None:
        self._oci.remove() if self._oci else self._backend.remove(self.id)

    def poll(self) -> int | None:
        if self.returncode is None and self._destroyed.is_set():
            return self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the box to exit and be removed; return its exit status.

        Any exception here (KeyboardInterrupt included) kills the box first,
        so no box outlives the call that was waiting for it.
        """
        if self.returncode is not None:
            return self.returncode
        limit = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._died.wait(0.05 if limit is None else max(0.0, min(0.05, limit - time.monotonic()))):
                if limit is not None and time.monotonic() >= limit:
                    raise TimeoutError(f"box {self.session} still running after {timeout} s")
            if self._attached is not None and not self.engine_lost:  # a wedged engine may never end the stream
                self._attached.drain(REMOVAL_GRACE)
            if self._direct is not None:
                self._direct.finish(REMOVAL_GRACE)
            if self._console is not None:
                self._console.drain(REMOVAL_GRACE)
            if not self._destroyed.wait(REMOVAL_GRACE):
                self._remove()
        except TimeoutError:
            raise
        except BaseException:
            self.kill()
            self._destroyed.wait(REMOVAL_GRACE) or self._remove()
            self._close()
            raise
        with self._finishing:  # a parent's node and the tree's end may wait on one box at once
            if self.returncode is None:
                self._close()
                self._end_world()
                code = self._exit_code if self._exit_code is not None else 137
                self.returncode = EXIT_QUINEBOX if self.engine_lost else EXIT_TIMEOUT if self.timed_out else code
                if self.place is not None:
                    self.place.ended(self)
        return self.returncode

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watch:
            engine_watch, token = self._watch
            engine_watch.discard(token)
        if self._deadline:
            self._deadline.cancel()
        os.write(self._stop_w, b"x")
        for stdio in (self._attached, self._console):
            if stdio is not None:
                stdio.close()
        os.close(self._stop_w)
        os.close(self._stop_r)
        for closer in (getattr(self, "_events", None), getattr(self, "_sock", None), self._broker, self._egress_proxy):
            if closer is not None:
                try:
                    closer.close()
                except OSError:
                    pass
        if self.spec.tls_dir:
            shutil.rmtree(self.spec.tls_dir, ignore_errors=True)
        if self.claimed is not None:
            forget(self.claimed.container)

    def __enter__(self) -> "BoxProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stdin:
            self.stdin.close()
        self.wait()
