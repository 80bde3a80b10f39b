"""The thin layer over the Docker Engine API (through docker-py's low-level client).

Each method is one engine request with its errors turned into quinebox's
own, so callers above never see docker-py exceptions or HTTP details.
"""

from __future__ import annotations

import socket
from typing import Any, Iterator

import docker
import docker.errors
from docker.utils import kwargs_from_env

from quinebox.errors import EngineError, ImageError
from quinebox.box.policy import LABEL_SESSION, ContainerConfig

ENGINE_HINT = "start the engine (`dockerd &` as root, or `systemctl start docker`), or set DOCKER_HOST; `quinebox doctor` checks"


_shared: "DockerBackend | None" = None


def _engine_error(exc: Exception) -> EngineError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return EngineError(f"cannot reach the Docker engine: {text}; {ENGINE_HINT}")


class DockerBackend:
    def __init__(self, api: docker.APIClient):
        self.api = api

    @classmethod
    def shared(cls) -> "DockerBackend":
        """One client per process: each connect costs a version round trip and a connection pool."""
        global _shared
        if _shared is None:
            _shared = cls.connect()
        return _shared

    @classmethod
    def connect(cls, timeout: float = 60) -> "DockerBackend":
        """`timeout` bounds each request; streams (attach, events) never time out."""
        try:
            return cls(docker.APIClient(version="auto", timeout=timeout, **kwargs_from_env()))
        except docker.errors.DockerException as exc:
            raise _engine_error(exc) from None

    def create(self, config: ContainerConfig) -> str:
        try:
            host_config = self.api.create_host_config(**config.host)
            return self.api.create_container(host_config=host_config, **config.create)["Id"]
        except docker.errors.ImageNotFound:
            image = config.create["image"]
            raise ImageError(f"image {image} not found: build it with `quinebox image build`") from None
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine refused to create the box: {exc.explanation or exc}") from None
        except Exception as exc:  # requests' connection errors and friends
            raise _engine_error(exc) from None

    def attach(self, container: str) -> socket.socket:
        """A hijacked connection: stdin goes in raw, stdout/stderr come back multiplexed."""
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        try:
            raw = self.api.attach_socket(container, params=params)
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot attach to the box: {exc.explanation or exc}") from None
        sock = getattr(raw, "_sock", raw)
        # The client's request timeout would otherwise end the stream after a
        # quiet spell (a box that thinks for a minute before printing).
        sock.settimeout(None)
        return sock

    def events(self, container: str) -> Iterator[dict[str, Any]]:
        """This container's lifecycle events, from now on: oom, die (with exitCode), destroy."""
        try:
            return self.api.events(filters={"container": container, "type": "container"}, decode=True)
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot follow the box's events: {exc.explanation or exc}") from None

    def start(self, container: str) -> None:
        try:
            self.api.start(container)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine could not start the box: {exc.explanation or exc}") from None

    def kill(self, container: str) -> None:
        try:
            self.api.kill(container, signal="SIGKILL")
        except docker.errors.APIError:
            pass  # already stopped, or already removed: either way it is not running

    def remove(self, container: str) -> None:
        """Remove a box and its anonymous volumes (an inherited world's overlay is one)."""
        try:
            self.api.remove_container(container, force=True, v=True)
        except docker.errors.APIError:
            pass  # gone already, or its removal is under way

    def boxes(self) -> list[dict[str, Any]]:
        """Every quinebox container, running or not."""
        try:
            return self.api.containers(all=True, filters={"label": LABEL_SESSION})
        except docker.errors.APIError as exc:
            raise EngineError(f"cannot list boxes: {exc.explanation or exc}") from None
        except Exception as exc:
            raise _engine_error(exc) from None
