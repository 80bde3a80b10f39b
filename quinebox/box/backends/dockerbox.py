"""One box on the Docker engine, as its listing shows it: a Box (boxes.py) whose every act is one engine request."""

from __future__ import annotations

from typing import Any

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.choice import ENGINE
from quinebox.box.backends.docker import DockerBackend


def boxes(engine: DockerBackend) -> list[DockerBox]:
    """Every quinebox container on the engine, running or not, as the Box that owns it."""
    return [DockerBox(engine, entry) for entry in engine.containers()]


class DockerBox(Box):
    """A container of quinebox's, from one entry of the engine's container list."""

    backend = ENGINE
    image_root = ""

    def __init__(self, engine: DockerBackend, entry: dict[str, Any]):
        self.engine = engine
        self.id: str = entry["Id"]
        self.labels: dict[str, str] = entry.get("Labels") or {}
        self.state: str = entry.get("State", "?")
        self.command: str = entry.get("Command", "")
        self.made: float = float(entry.get("Created") or 0)
        #: The host paths mounted into it (a guest runtime in use is one).
        self.mounts: list[str] = [m.get("Source", "") for m in entry.get("Mounts") or []]

    def kill(self, signal: str = "KILL") -> bool:
        return self.engine.kill(self.id, signal)

    def destroy(self) -> bool:
        return self.engine.remove(self.id)

    def process(self) -> tuple[str, str]:
        config = self.engine.container_config(self.id)
        return config.get("User") or "", config.get("WorkingDir") or "/"
