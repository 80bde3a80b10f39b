"""The Docker backend's thin layer over the Docker Engine API (docker-py's low-level client): `DockerBackend`, the
engine's client, and its errors translated.

Each method is one engine request, asked inside `_asking`: the one place its failures are turned into
quinebox's own, so callers above never see docker-py exceptions or HTTP details. Only what the engine or the
way to it raises is translated (docker-py's errors, requests' and urllib3's, an OSError of the socket); any
other exception is a bug here and goes up as it is, never dressed as an engine that cannot be reached.
A deadline is recognised by its type, however deep docker-py wrapped it.

Every request has a deadline (`QUINEBOX_ENGINE_TIMEOUT`, 30 s; killing, removing and pinging 10 s): an
engine that has wedged is reported, never waited on for ever. Streams (attach, events) have none;
`box.watch` notices an engine gone quiet.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions
from docker.utils import kwargs_from_env

from quinebox.box.backends.reach import unreachable
from quinebox.box.policy import LABEL_OWNER, LABEL_SESSION, ContainerConfig
from quinebox.errors import EngineError, ImageError, QuineboxError
from quinebox.processes import owner_id

ENGINE_HINT = "start the engine (`dockerd &` as root, or `systemctl start docker`), or set DOCKER_HOST; `quinebox doctor` checks"

#: Killing, removing and pinging get less: they must never hold up an exit.
QUICK_TIMEOUT = 10.0
#: What the engine, or the way to it, raises: all that `_asking` translates.
#: What the engine, or the way to it, raises when it fails: its refusals (APIError is a requests HTTPError), the
#: transport's errors, the socket's, and a TLS or client configuration that cannot reach it. Not docker-py's
#: DockerException as such: it also says docker-py refused an argument of ours (NullResource, InvalidArgument,
#: a bad size from create_host_config), which is a bug in quinebox and goes up as itself. The one plain
#: DockerException that is the engine's failure, the version round trip of a connect, is caught there.
ENGINE_ERRORS = (
    requests.exceptions.RequestException, urllib3.exceptions.HTTPError, OSError,
    docker.errors.TLSParameterError, docker.errors.InvalidConfigFile,
)
_TIMEOUTS = (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, socket.timeout)


def engine_timeout() -> float:
    """How long one engine request may take; read when used (a command server's worker has its client's environment)."""
    return float(os.environ.get("QUINEBOX_ENGINE_TIMEOUT", "30"))


_shared: tuple[str, DockerBackend] | None = None


def timed_out(exc: BaseException | None) -> bool:
    """Whether a deadline is what failed, by its type: requests wraps urllib3's read timeout in a ConnectionError's args."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, _TIMEOUTS) or any(isinstance(arg, _TIMEOUTS) for arg in exc.args):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _engine_error(exc: BaseException, what: str) -> EngineError:
    if timed_out(exc):
        return EngineError(f"the Docker engine did not answer {what} in time: it may be wedged (`quinebox doctor` checks; restart it if it stays so)")
    found = unreachable()  # not installed, not running, or a socket this user may not open: each has its own fix
    if found is not None:
        return EngineError(f"cannot reach the Docker engine: {found.reason}; {found.fix} (`quinebox doctor` checks)")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return EngineError(f"cannot reach the Docker engine: {text}; {ENGINE_HINT}")


@contextlib.contextmanager
def _asking(what: str, refused: str, *, missing: QuineboxError | None = None) -> Iterator[None]:
    """One engine request, `what` it is: its refusal EngineError(`refused`: the engine's reason), a 404 `missing`
    when given, and failing to reach the engine (or a deadline) `_engine_error`. Nothing else is caught."""
    try:
        yield
    except docker.errors.NotFound as exc:
        if missing is not None:
            raise missing from None
        raise EngineError(f"{refused}: {exc.explanation or exc}") from None
    except docker.errors.APIError as exc:
        raise EngineError(f"{refused}: {exc.explanation or exc}") from None
    except ENGINE_ERRORS as exc:
        raise _engine_error(exc, what) from None


def _stream(raw: Any) -> socket.socket:
    """The socket under a hijacked connection, with no timeout: the client's request timeout would otherwise
    end the stream after a quiet spell (a box that thinks for a minute before printing)."""
    sock = getattr(raw, "_sock", raw)
    sock.settimeout(None)
    return sock


class DockerBackend:
    #: (DOCKER_HOST, its engine's API version) when already known (a command server learns it once):
    #: connecting to that engine then costs no round trip.
    known_version: tuple[str, str] | None = None

    def __init__(self, api: docker.APIClient, quick: docker.APIClient | None = None):
        self.api = api
        #: The same engine with the short deadline, for what must not hold anything up.
        self.quick = quick or api

    @classmethod
    def shared(cls) -> DockerBackend:
        """One client per process and engine: each connect costs a version round trip and a connection pool. Per
        engine and deadline (DOCKER_HOST, QUINEBOX_ENGINE_TIMEOUT): a command server's worker runs one client's
        command after another, each with its own environment."""
        global _shared
        key = f"{os.environ.get('DOCKER_HOST', '')} {engine_timeout()}"
        if _shared is None or _shared[0] != key:
            _shared = key, cls.connect()
        return _shared[1]

    @classmethod
    def connect(cls, timeout: float | None = None) -> DockerBackend:
        """`timeout` bounds each request (default engine_timeout()); streams (attach, events) never time out."""
        options = kwargs_from_env()
        known = cls.known_version
        version = known[1] if known and known[0] == os.environ.get("DOCKER_HOST", "") else "auto"
        with _asking("its version", "the engine refused to say its version"):
            try:
                api = docker.APIClient(version=version, timeout=timeout or engine_timeout(), **options)
            except docker.errors.DockerException as exc:  # "Error while fetching server API version": the engine's
                raise _engine_error(exc, "its version") from exc
        return cls(api, docker.APIClient(version=api.api_version, timeout=QUICK_TIMEOUT, **options))

    def close(self) -> None:
        self.api.close()
        self.quick.close()

    def ping(self) -> None:
        """EngineError unless the engine answers within QUICK_TIMEOUT."""
        with _asking("a ping", "the engine refused a ping"):
            self.quick.ping()

    def create(self, config: ContainerConfig) -> str:
        image = config.create["image"]
        with _asking("the request to create a box", "the engine refused to create the box", missing=ImageError(f"image {image} not found: build it with `quinebox image build`")):
            host_config = self.api.create_host_config(**config.host)
            return self.api.create_container(host_config=host_config, **config.create)["Id"]

    def attach(self, container: str) -> socket.socket:
        """A hijacked connection: stdin goes in raw, stdout/stderr come back multiplexed."""
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        with _asking("the request to attach to a box", "cannot attach to the box"):
            return _stream(self.api.attach_socket(container, params=params))

    def events(self, container: str) -> Iterator[dict[str, Any]]:
        """This container's lifecycle events, from now on: oom, die (with exitCode), destroy."""
        with _asking("the request for a box's events", "cannot follow the box's events"):
            return self.api.events(filters={"container": container, "type": "container"}, decode=True)

    def start(self, container: str) -> None:
        with _asking("the request to start a box", "the engine could not start the box"):
            self.api.start(container)

    def update(self, container: str, limits: dict[str, int]) -> None:
        """Change a running box's limits (those the engine changes: memory)."""
        with _asking("the request to set a box's limits", "the engine could not set the box's limits"):
            self.api.update_container(container, **limits)

    def pause(self, container: str) -> None:
        """Stop every process of the box where it is (the engine's freezer); `unpause` lets them go on."""
        with _asking("the request to pause a box", "the engine could not pause the box"):
            self.quick.pause(container)

    def unpause(self, container: str) -> None:
        with _asking("the request to resume a box", "the engine could not resume the box"):
            self.quick.unpause(container)

    def experimental(self) -> bool:
        """Whether the engine runs with its experimental features (`docker checkpoint` is one)."""
        with _asking("the request for its features", "the engine refused to say its features"):
            return bool(self.quick.info().get("ExperimentalBuild"))

    def remaps_users(self) -> bool:
        """Whether the engine runs its containers in user namespaces of its own (dockerd's --userns-remap)."""
        with _asking("the request for its security options", "the engine refused to say its security options"):
            return any("name=userns" in str(option) for option in self.quick.info().get("SecurityOptions") or ())

    def kill(self, container: str, signal: str = "KILL") -> bool:
        """Whether the engine took the kill (or the box had stopped already); False when it did not answer.

        A box the engine cannot kill still dies once its owner lets go of its lifeline."""
        try:
            self.quick.kill(container, signal=f"SIG{signal}")
        except docker.errors.APIError:
            pass  # already stopped, or already removed: either way it is not running
        except ENGINE_ERRORS:
            return False
        return True

    def remove(self, container: str) -> bool:
        """Remove a box and its anonymous volumes (an inherited world's overlay is one). True only when it is
        gone: removed now, gone already, or its removal under way; False when the engine refused or did not
        answer (then `quinebox gc` removes it once the engine is back: its owner is gone by then)."""
        try:
            self.quick.remove_container(container, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            return exc.status_code == 409  # "removal already in progress": the engine finishes it
        except ENGINE_ERRORS:
            return False
        return True

    # -- images ------------------------------------------------------------------------

    def inspect_image(self, name: str) -> dict[str, Any] | None:
        """The image's inspect data, or None when it is not here."""
        try:
            with _asking(f"the request to inspect image {name}", f"cannot inspect image {name}", missing=_Missing()):
                return self.api.inspect_image(name)
        except _Missing:
            return None

    def image_id(self, name: str) -> str | None:
        data = self.inspect_image(name)
        return data["Id"] if data else None

    def pull(self, name: str, say: Callable[[str], None]) -> None:
        """Pull `name`, saying what happens as it happens; one line and ImageError when it cannot be had."""
        repository, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "latest")
        layers: set[str] = set()
        try:
            for event in self.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
                if "error" in event:
                    raise ImageError(f"cannot pull {name}: {str(event['error']).strip()}")
                if event.get("status") == "Pull complete" and event.get("id") not in layers:
                    layers.add(event["id"])
                    say(f"{name}: layer {event['id']} done ({len(layers)})")
        except docker.errors.APIError as exc:
            reason = (exc.explanation or str(exc)).strip().splitlines()[0]
            raise ImageError(f"cannot pull {name} (is a registry reachable?): {reason}") from None
        except ENGINE_ERRORS as exc:
            raise ImageError(f"cannot pull {name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        say(f"pulled {name}")

    def _scratch(self, image: str, session: str, refused: str) -> str:
        """A container of `image` created to be read and never started, labelled as this process's so that `gc`
        removes it if this process dies before it does."""
        labels = {LABEL_SESSION: session, LABEL_OWNER: owner_id()}
        missing = ImageError(f"image {image} not found: build it with `quinebox image build`, or `docker pull` it")
        with _asking(f"the request to read image {image}", refused, missing=missing):
            return self.api.create_container(image, command=["/nonexistent"], network_disabled=True, labels=labels)["Id"]

    @contextlib.contextmanager
    def archive(self, image: str, path: str) -> Iterator[io.BufferedReader]:
        """`path` of `image` as a tar stream, read from a scratch container of it."""
        container = self._scratch(image, "image-copy", f"cannot read {path} from image {image}")
        try:
            missing = ImageError(f"image {image} has no {path}: rebuild it with `quinebox image build`")
            with _asking(f"the request to read {path} from image {image}", f"cannot read {path} from image {image}", missing=missing):
                chunks, _ = self.api.get_archive(container, path)
            yield io.BufferedReader(_Chunks(chunks), buffer_size=1 << 20)
        finally:
            self.remove(container)

    @contextlib.contextmanager
    def export_image(self, image: str) -> Iterator[io.BufferedReader]:
        """`image`'s whole filesystem, flattened, as one tar stream (`docker export` of a scratch container of it).

        Each read of the stream has the engine's deadline: an engine that stops answering mid-way is an EngineError."""
        container = self._scratch(image, "image-export", f"cannot export image {image}")
        try:
            with _asking(f"the request to export image {image}", f"cannot export image {image}"):
                # Not api.export: it starts only when first read and takes the deadline off the socket.
                response = self.api._get(self.api._url("/containers/{0}/export", container), stream=True)
                self.api._raise_for_status(response)
            try:
                yield io.BufferedReader(_Chunks(self._engine_chunks(response.iter_content(1 << 20), image)), buffer_size=1 << 20)
            finally:
                response.close()
        finally:
            self.remove(container)

    @staticmethod
    def _engine_chunks(chunks: Iterable[bytes], image: str) -> Iterator[bytes]:
        """`chunks` of image's export, with a failure to read the next one (the engine gone, or silent past its deadline) as an EngineError."""
        try:
            yield from chunks
        except ENGINE_ERRORS as exc:
            if timed_out(exc):
                raise EngineError(f"the Docker engine stopped sending image {image} mid-way: it may be wedged (`quinebox doctor` checks)") from None
            raise _engine_error(exc, f"the request to export image {image}") from None

    def image_ids(self) -> set[str]:
        """The ids of every image the engine holds (intermediate ones too)."""
        with _asking("the request to list images", "cannot list images"):
            return set(self.api.images(all=True, quiet=True))

    def exists(self, container: str, path: str) -> bool:
        """Whether `path` exists in a (created, maybe not started) container, links not followed."""
        try:
            with _asking("the request to look inside a box", "cannot look inside the box", missing=_Missing()):
                chunks, _ = self.api.get_archive(container, path, chunk_size=1 << 12)
        except _Missing:
            return False
        close = getattr(chunks, "close", None)
        if close:
            close()
        return True

    # -- commands in a live box ------------------------------------------------------------

    def container_config(self, container: str) -> dict[str, Any]:
        """A box's own Config (its User, WorkingDir, Env), as the engine created it."""
        with _asking("the request to look at a box", "cannot look at the box", missing=EngineError("that box is gone")):
            return self.quick.inspect_container(container)["Config"]

    def exec_create(self, container: str, argv: list[str], *, tty: bool, user: str | None = None, cwd: str | None = None, env: list[str] | None = None) -> str:
        """A command to run in a live box, as the box's own user (or `user`, never root: the caller checks),
        with its environment (and `env`) and limits."""
        with _asking("the request to run a command in a box", "cannot run a command in the box", missing=EngineError("that box is gone")):
            user = user or self.api.inspect_container(container)["Config"].get("User") or ""
            return self.api.exec_create(
                container, argv, stdin=True, stdout=True, stderr=True, tty=tty, user=user, privileged=False, workdir=cwd, environment=env or None
            )["Id"]

    def exec_start(self, exec_id: str, *, tty: bool) -> socket.socket:
        with _asking("the request to start a command in a box", "cannot start the command in the box"):
            return _stream(self.api.exec_start(exec_id, socket=True, tty=tty))

    def exec_pid(self, exec_id: str) -> int | None:
        """The host's pid of a started command in a box, once the engine has one."""
        try:
            return self.quick.exec_inspect(exec_id).get("Pid") or None
        except ENGINE_ERRORS:
            return None

    def exec_exit_code(self, exec_id: str) -> int | None:
        try:
            return self.quick.exec_inspect(exec_id).get("ExitCode")
        except ENGINE_ERRORS:  # gone, or the engine does not answer: no status to give
            return None

    def exec_resize(self, exec_id: str, rows: int, cols: int) -> None:
        try:
            self.quick.exec_resize(exec_id, height=rows, width=cols)
        except ENGINE_ERRORS:  # the next change of size tries again
            pass

    # -- terminals -----------------------------------------------------------------------

    def resize(self, container: str, rows: int, cols: int) -> None:
        try:
            self.quick.resize(container, height=rows, width=cols)
        except ENGINE_ERRORS:
            pass  # not started yet, gone, or the engine is slow: the next change of size tries again

    def containers(self) -> list[dict[str, Any]]:
        """The engine's list entry of every quinebox container, running or not (dockerbox.boxes makes them Boxes)."""
        with _asking("the request to list boxes", "cannot list boxes"):
            return self.api.containers(all=True, filters={"label": LABEL_SESSION})


class _Missing(QuineboxError):
    """A 404 that its request answers with None or False, not an error."""


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks as a readable stream."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size
