"""A box on the Docker engine: created (or claimed warm from the pool), its events followed, its streams attached.

The engine's events, not the box, are the authority on its exit status and on
an OOM kill: `die` brings the status, `destroy` says the box is gone. The
engine's `oom` event can be lost (containerd drops one it reads after the box's
cgroup is gone, as under load on cgroup v1), so the host also reads the box's
memory cgroup itself when the box's init says its command died of SIGKILL
(broker.killed): the kernel's count, read while the box still stands. The
events stream may end because the engine did (or stopped the box on its way
down): that is an engine incident, told to the box's `Ends` as ENGINE_LOST. A
programming error in following the events is not: the box is killed, ends as
INTERNAL_ERROR, and the error propagates (its traceback printed by the thread).
"""

from __future__ import annotations

import http.client
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

import docker.errors
import requests.exceptions
import urllib3.exceptions

from quinebox.box.backends import watch
from quinebox.box.backends.docker.attached import AttachedStdio
from quinebox.box.backends.docker.configure import configure
from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.backends.exec_cgroups import cgroup_of, oom_kills
from quinebox.box.net.broker import Broker
from quinebox.box.net.secrets import engine_reader
from quinebox.box.policy import ContainerConfig
from quinebox.box.pool.claim import Claimed, claim, forget
from quinebox.box.run.ending import EXIT_KILLED, Ends, How
from quinebox.box.shape import claim_frame
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo
from quinebox.box.streams import relay
from quinebox.box.streams.direct import Stream
from quinebox.errors import ImageError

#: What the engine's event stream raises when the engine closes it or goes away (docker-py lets them through).
ENGINE_STREAM_ERRORS = (
    docker.errors.DockerException, docker.errors.StreamParseError, requests.exceptions.RequestException,
    urllib3.exceptions.HTTPError, http.client.HTTPException, OSError,
)


class DockerLaunch:
    """One box on the engine of `backend` (the shared one when None)."""

    def __init__(self, backend: DockerBackend | None, ends: Ends, *, session: str, reader_gone: Callable[[], None]):
        self.backend = backend or DockerBackend.shared()
        self.id: str | None = None
        self.stdin: relay.StdinWriter | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self.say: Callable[[bytes], None] | None = None
        self.claimed: Claimed | None = None
        self._ends = ends
        self._session = session
        self._reader_gone = reader_gone
        self._events: Iterator[dict[str, Any]] | None = None
        self._sock: socket.socket | None = None
        self._attached: AttachedStdio | None = None
        self._watch: tuple[watch.EngineWatch, int] | None = None
        self._closed = False
        self._tty = False

    def configure(self, spec: BoxSpec, *, lasting: bool = False) -> tuple[BoxSpec, ImageInfo, ContainerConfig]:
        return configure(spec, self.backend)

    def reader(self, config: ContainerConfig, image: str) -> Callable[[str], bytes]:
        return engine_reader(self.backend, image)

    def claim(self, spec: BoxSpec, config: ContainerConfig, *, lasting: bool = False) -> socket.socket | None:
        self.claimed = claim(spec, config, self.backend)
        if self.claimed is None:
            return None
        self.claimed.settle(spec, config.create["command"])
        return self.claimed.listener

    def world_owner(self, spec: BoxSpec) -> tuple[int, int]:
        """The engine runs the box as `spec.uid` itself (its own user namespaces, where its daemon remaps, are
        its own: `quinebox doctor` says whether it does)."""
        return spec.uid, spec.gid

    def start(self, spec: BoxSpec, config: ContainerConfig, streams: tuple[Stream | bytes, Stream, Stream], *, broker: Broker | None, stop_fd: int) -> None:
        """The box created (or a warm one claimed), its events followed, its streams attached, started."""
        stdin, stdout, stderr = streams
        self._tty = spec.tty
        if broker is not None:  # before the box runs: a warm box's command starts as its claim arrives
            broker.killed = self._killed
        claimed = self.claimed
        self.id = claimed.container if claimed else self.backend.create(config)
        if spec.agent and spec.image != DEFAULT_IMAGE and not (claimed.shell if claimed else self.backend.exists(self.id, "/bin/sh")):
            raise ImageError(f"image {spec.image} has no /bin/sh: an agent's sh tool runs the image's own shell; choose an image that has one")
        self._events = self.backend.events(self.id)
        threading.Thread(target=self._follow_events, name=f"events:{self._session}", daemon=True).start()
        self._sock = claimed.attach if claimed else self.backend.attach(self.id)
        self._attached = attached = AttachedStdio(self._sock, stdout, stderr, tty=spec.tty, broken=self._reader_gone, name=self._session)
        self.stdout, self.stderr, self.say = attached.stdout, attached.stderr, attached.err
        if claimed is None:
            self.backend.start(self.id)
        else:  # a warm box runs already: its claim tells it what to run, as a cold box's config would have
            claimed.start(claim_frame(spec, config), broker)
        self._watch = watch.watch(self.backend, self._lose_engine)
        attached.connect_stdin(stdin, stop_fd)
        self.stdin = attached.stdin

    def _follow_events(self) -> None:
        destroyed = outside = failed = False
        assert self._events is not None
        try:
            for event in self._events:
                action = event.get("Action") or event.get("status")
                if action == "oom":
                    self._ends.oom()
                elif action == "kill" and not self._ends.caused:
                    outside = True  # a kill the host did not send: someone's `docker kill`, or the engine stopping
                elif action == "die":
                    self._ends.exit(int(event.get("Actor", {}).get("Attributes", {}).get("exitCode", EXIT_KILLED)))
                elif action == "destroy":
                    destroyed = True
                    break
        except ENGINE_STREAM_ERRORS:
            pass  # the engine closed the stream: whether it went away, the finally asks it
        except BaseException as exc:
            failed = True
            if not self._closed:  # a stream we closed ends however it ends
                self._fail(exc)
                raise
        finally:
            if not failed and not self._closed and watch.engine_went_away(self.backend, died=self._ends.exited.is_set(), destroyed=destroyed, outside=outside):
                self._ends.cause(How.ENGINE_LOST, "the Docker engine went away while the box ran (it stopped or restarted)")
                watch.record_incident(f"box {self._session} given up: its event stream ended before it did", session=self._session)
            self._ends.end()

    def _killed(self, pid: int) -> None:
        """The box's init (host pid `pid`) says its command died of SIGKILL and waits: an OOM kill if the kernel
        counted one in the box's memory cgroup, whatever the engine's events say."""
        try:
            cgroup = cgroup_of(pid, "memory")
        except (OSError, StopIteration, ValueError):
            return  # the init is gone already (its wait ran out): the engine's event is all there is
        if self.id and self.id in cgroup and oom_kills(cgroup) > 0:  # the engine names the box's cgroup for its id: a
            self._ends.oom()  # pid reused once the init's wait ran out is another process's, and is not read

    def _fail(self, exc: BaseException) -> None:
        """A bug of ours while the box runs: it ends now, and says so in its stderr; the engine is not blamed."""
        reason = f"quinebox failed while following the box's events ({type(exc).__name__}: {exc}): an internal error, not the engine's"
        if self._ends.cause(How.INTERNAL_ERROR, reason) and self.say is not None:
            self.say(f"quinebox: {reason}\n".encode(errors="replace"))
        if self.id:
            self.backend.kill(self.id)
            self.backend.remove(self.id)

    def _lose_engine(self, reason: str) -> None:
        """The engine stopped answering: end the wait now; the box dies once its lifeline is let go."""
        if not self._ends.exited.is_set() and not self._closed:
            self._ends.cause(How.ENGINE_LOST, reason)
            self._ends.end()

    def kill(self) -> None:
        if self.id:
            self.backend.kill(self.id)

    def signal(self, signum: int) -> None:
        if self.id and not self._ends.exited.is_set():
            self.backend.kill(self.id, signal.Signals(signum).name)

    @property
    def pid(self) -> int | None:
        return None

    def remove(self) -> None:
        if self.id:
            self.backend.remove(self.id)

    def resize(self, rows: int, cols: int) -> None:
        if self.id and self._tty and not self._ends.exited.is_set():
            self.backend.resize(self.id, rows, cols)

    def drain(self, grace: float) -> None:
        if self._attached is not None and self._ends.now().how is not How.ENGINE_LOST:  # a wedged engine may never end the stream
            self._attached.drain(grace)

    def close(self) -> None:
        self._closed = True
        if self._watch:
            engine_watch, token = self._watch
            engine_watch.discard(token)
        if self._attached is not None:
            self._attached.close()
        closers: tuple[Any, ...] = (self._events, self._sock)
        for closer in closers:
            if closer is not None:
                try:
                    closer.close()
                except OSError:
                    pass
        if self.claimed is not None:
            forget(self.claimed.container)

    def abandon(self) -> None:
        if self.claimed is not None:
            self.claimed.release()
        if self.id:
            self.backend.remove(self.id)  # if the engine does not answer, `quinebox gc` removes it once it does
