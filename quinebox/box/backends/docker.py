"""The thin layer over the Docker Engine API (through docker-py's low-level client).

Each method is one engine request with its errors turned into quinebox's
own, so callers above never see docker-py exceptions or HTTP details. Every
request has a deadline (`QUINEBOX_ENGINE_TIMEOUT`, 30 s; killing, removing and
pinging 10 s): an engine that has wedged is reported, never waited on for ever.
Streams (attach, events) have none; `box.watch` notices an engine gone quiet.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
from typing import Any, Callable, Iterable, Iterator

import docker
import docker.errors
import requests.exceptions
from docker.utils import kwargs_from_env

from quinebox.box.backends.reach import unreachable
from quinebox.box.policy import LABEL_OWNER, LABEL_SESSION, ContainerConfig
from quinebox.processes import owner_id
from quinebox.errors import EngineError, ImageError

ENGINE_HINT = "start the engine (`dockerd &` as root, or `systemctl start docker`), or set DOCKER_HOST; `quinebox doctor` checks"

#: Killing, removing and pinging get less: they must never hold up an exit.
QUICK_TIMEOUT = 10.0


def engine_timeout() -> float:
    """How long one engine request may take; read when used (a command server's worker has its client's environment)."""
    return float(os.environ.get("QUINEBOX_ENGINE_TIMEOUT", "30"))


_shared: "DockerBackend | None" = None


def _timed_out(exc: BaseException | None) -> bool:
    """Whether a deadline is what failed, however deep docker-py wrapped it."""
    while exc is not None:
        if isinstance(exc, (requests.exceptions.Timeout, TimeoutError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _engine_error(exc: Exception, what: str = "a request") -> EngineError:
    if _timed_out(exc):
        return EngineError(f"the Docker engine did not answer {what} in time: it may be wedged (`quinebox doctor` checks; restart it if it stays so)")
    found = unreachable()  # not installed, not running, or a socket this user may not open: each has its own fix
    if found is not None:
        return EngineError(f"cannot reach the Docker engine: {found.reason}; {found.fix} (`quinebox doctor` checks)")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return EngineError(f"cannot reach the Docker engine: {text}; {ENGINE_HINT}")


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
    def shared(cls) -> "DockerBackend":
        """One client per process: each connect costs a version round trip and a connection pool."""
        global _shared
        if _shared is None:
            _shared = cls.connect()
        return _shared

    @classmethod
    def connect(cls, timeout: float | None = None) -> "DockerBackend":
        """`timeout` bounds each request (default engine_timeout()); streams (attach, events) never time out."""
        options = kwargs_from_env()
        try:
            known = cls.known_version
            version = known[1] if known and known[0] == os.environ.get("DOCKER_HOST", "") else "auto"
            api = docker.APIClient(version=version, timeout=timeout or engine_timeout(), **options)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise _engine_error(exc, "its version") from None
        return cls(api, docker.APIClient(version=api.api_version, timeout=QUICK_TIMEOUT, **options))

    def close(self) -> None:
        self.api.close()
        self.quick.close()

    def ping(self) -> None:
        """EngineError unless the engine answers within QUICK_TIMEOUT."""
        try:
            self.quick.ping()
        except Exception as exc:
            raise _engine_error(exc, "a ping") from None

    def create(self, config: ContainerConfig) -> str:
        try:
            host_config = self.api.create_host_config(**config.host)
            return self.api.create_container(host_config=host_config, **config.create)["Id"]
        except docker.errors.ImageNotFound:
            image = config.create["image"]
            raise ImageError(f"image {image} not found: build it with `quinebox image build`") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine refused to create the box: {exc.explanation or exc}") from None
        except Exception as exc:  # requests' connection errors and timeouts
            raise _engine_error(exc, "the request to create a box") from None

    def attach(self, container: str) -> socket.socket:
        """A hijacked connection: stdin goes in raw, stdout/stderr come back multiplexed."""
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        try:
            raw = self.api.attach_socket(container, params=params)
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot attach to the box: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to attach to a box") from None
        return _stream(raw)

    def events(self, container: str) -> Iterator[dict[str, Any]]:
        """This container's lifecycle events, from now on: oom, die (with exitCode), destroy."""
        try:
            return self.api.events(filters={"container": container, "type": "container"}, decode=True)
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot follow the box's events: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request for a box's events") from None

    def start(self, container: str) -> None:
        try:
            self.api.start(container)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not start the box: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to start a box") from None

    def update(self, container: str, limits: dict[str, int]) -> None:
        """Change a running box's limits (those the engine changes: memory)."""
        try:
            self.api.update_container(container, **limits)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not set the box's limits: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to set a box's limits") from None

    def kill(self, container: str) -> bool:
        """Whether the engine took the kill (or the box had stopped already); False when it did not answer.

        A box the engine cannot kill still dies once its owner lets go of its lifeline."""
        try:
            self.quick.kill(container, signal="SIGKILL")
        except docker.errors.APIError:
            pass  # already stopped, or already removed: either way it is not running
        except Exception:
            return False
        return True

    def remove(self, container: str) -> bool:
        """Remove a box and its anonymous volumes (an inherited world's overlay is one); False when the engine
        did not answer (then `quinebox gc` removes it once the engine is back: its owner is gone by then)."""
        try:
            self.quick.remove_container(container, force=True, v=True)
        except docker.errors.APIError:
            pass  # gone already, or its removal is under way
        except Exception:
            return False
        return True

    # -- images ------------------------------------------------------------------------

    def inspect_image(self, name: str) -> dict[str, Any] | None:
        """The image's inspect data, or None when it is not here."""
        try:
            return self.api.inspect_image(name)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                return None
            raise EngineError(f"cannot inspect image {name}: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, f"the request to inspect image {name}") from None

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
        except ImageError:
            raise
        except Exception as exc:
            raise ImageError(f"cannot pull {name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        say(f"pulled {name}")

    @contextlib.contextmanager
    def archive(self, image: str, path: str) -> Iterator[io.BufferedReader]:
        """`path` of `image` as a tar stream, read from a container that is created for it and never started.

        It is labelled as this process's, so that `gc` removes it if this process dies before it does."""
        labels = {LABEL_SESSION: "image-copy", LABEL_OWNER: owner_id()}
        try:
            container = self.api.create_container(image, command=["/nonexistent"], network_disabled=True, labels=labels)["Id"]
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot read {path} from image {image}: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, f"the request to read {path} from image {image}") from None
        try:
            try:
                chunks, _ = self.api.get_archive(container, path)
            except docker.errors.NotFound:
                raise ImageError(f"image {image} has no {path}: rebuild it with `quinebox image build`") from None
            except Exception as exc:
                raise _engine_error(exc, f"the request to read {path} from image {image}") from None
            yield io.BufferedReader(_Chunks(chunks), buffer_size=1 << 20)
        finally:
            self.remove(container)

    @contextlib.contextmanager
    def export_image(self, image: str) -> Iterator[io.BufferedReader]:
        """`image`'s whole filesystem, flattened, as one tar stream (`docker export` of a container created for it and never started).

        Labelled as this process's, like `archive`'s, so that `gc` removes it if this process dies first.
        Each read of the stream has the engine's deadline: an engine that stops answering mid-way is an EngineError."""
        labels = {LABEL_SESSION: "image-export", LABEL_OWNER: owner_id()}
        what = f"the request to export image {image}"
        try:
            container = self.api.create_container(image, command=["/nonexistent"], network_disabled=True, labels=labels)["Id"]
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {image} not found: build it with `quinebox image build`, or `docker pull` it") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot export image {image}: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, what) from None
        try:
            try:
                # Not api.export: it starts only when first read and takes the deadline off the socket.
                response = self.api._get(self.api._url("/containers/{0}/export", container), stream=True)
                self.api._raise_for_status(response)
            except docker.errors.APIError as exc:
                raise EngineError(f"cannot export image {image}: {exc.explanation or exc}") from None
            except Exception as exc:
                raise _engine_error(exc, what) from None
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
        except Exception as exc:
            if _timed_out(exc) or "timed out" in str(exc).lower():
                raise EngineError(f"the Docker engine stopped sending image {image} mid-way: it may be wedged (`quinebox doctor` checks)") from None
            raise _engine_error(exc, f"the request to export image {image}") from None

    def image_ids(self) -> set[str]:
        """The ids of every image the engine holds (intermediate ones too)."""
        try:
            return set(self.api.images(all=True, quiet=True))
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot list images: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to list images") from None

    def exists(self, container: str, path: str) -> bool:
        """Whether `path` exists in a (created, maybe not started) container, links not followed."""
        try:
            chunks, _ = self.api.get_archive(container, path, chunk_size=1 << 12)
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot look inside the box: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to look inside a box") from None
        close = getattr(chunks, "close", None)
        if close:
            close()
        return True

    # -- commands in a live box ------------------------------------------------------------

    def container_config(self, container: str) -> dict[str, Any]:
        """A box's own Config (its User, WorkingDir, Env), as the engine created it."""
        try:
            return self.quick.inspect_container(container)["Config"]
        except docker.errors.NotFound:
            raise EngineError("that box is gone") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to look at a box") from None

    def exec_create(self, container: str, argv: list[str], *, tty: bool, user: str | None = None, cwd: str | None = None, env: list[str] | None = None) -> str:
        """A command to run in a live box, as the box's own user (or `user`, never root: the caller checks),
        with its environment (and `env`) and limits."""
        try:
            user = user or self.api.inspect_container(container)["Config"].get("User") or ""
            return self.api.exec_create(
                container, argv, stdin=True, stdout=True, stderr=True, tty=tty, user=user, privileged=False, workdir=cwd, environment=env or None
            )["Id"]
        except docker.errors.NotFound:
            raise EngineError("that box is gone") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot run a command in the box: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to run a command in a box") from None

    def exec_start(self, exec_id: str, *, tty: bool) -> socket.socket:
        try:
            raw = self.api.exec_start(exec_id, socket=True, tty=tty)
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot start the command in the box: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to start a command in a box") from None
        return _stream(raw)

    def exec_pid(self, exec_id: str) -> int | None:
        """The host's pid of a started command in a box, once the engine has one."""
        try:
            return self.quick.exec_inspect(exec_id).get("Pid") or None
        except Exception:
            return None

    def exec_exit_code(self, exec_id: str) -> int | None:
        try:
            return self.quick.exec_inspect(exec_id).get("ExitCode")
        except Exception:  # gone, or the engine does not answer: no status to give
            return None

    def exec_resize(self, exec_id: str, rows: int, cols: int) -> None:
        try:
            self.quick.exec_resize(exec_id, height=rows, width=cols)
        except Exception:  # the next change of size tries again
            pass

    # -- terminals -----------------------------------------------------------------------

    def resize(self, container: str, rows: int, cols: int) -> None:
        try:
            self.quick.resize(container, height=rows, width=cols)
        except Exception:
            pass  # not started yet, gone, or the engine is slow: the next change of size tries again

    def boxes(self) -> list[dict[str, Any]]:
        """Every quinebox container, running or not."""
        try:
            return self.api.containers(all=True, filters={"label": LABEL_SESSION})
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot list boxes: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc, "the request to list boxes") from None


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
