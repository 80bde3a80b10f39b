"""What a worker node runs: its readiness check, and one attempt at one input.

An attempt is a Ray streaming generator, so what it sends home is a sequence of small objects:
first where it runs and whether the node can run boxes at all, then how the agent ended and which
sessions its tree made, then the deliverable, the diagnostics and each session's tape in pieces of
at most CHUNK bytes. No process ever holds a whole deliverable. The boxes run as in a local `map`
(their owner is this Ray worker, so they die with it through their lifelines) and carry the run,
input and attempt as labels. Everything spooled here is gone when the attempt is.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from quinebox.errors import EngineError, QuineboxError
from quinebox.state import session_dir, state_dir

#: The most any one object of an attempt's stream holds.
CHUNK = 4 << 20


def node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def host_name() -> str:
    """The node's host name, or its address where the machine has no name."""
    import ray

    return socket.gethostname() or ray.util.get_node_ip_address()


def unready(image: str | None) -> str | None:
    """Why this node cannot run boxes of `image` now (no engine, no image), or None when it can."""
    from quinebox.box.backends.docker import DockerBackend
    from quinebox.box.image import image_exists
    from quinebox.box.spec import DEFAULT_IMAGE

    name = image or DEFAULT_IMAGE
    try:
        backend = DockerBackend.connect()
        backend.ping()
        if not image_exists(backend, name):
            return f"image {name} is not on node {host_name()}: build or load it there (`quinebox image build` for quinebox's own)"
    except QuineboxError as exc:
        return str(exc)
    except Exception as exc:  # an engine that stopped answering between requests
        return f"the engine on node {host_name()} did not answer: {exc}"
    return None


def check(image: str | None = None) -> dict[str, Any]:
    """`quinebox doctor --cluster`: this node, and why it cannot run boxes (None when it can)."""
    return {"node": node_id(), "host": host_name(), "why": unready(image)}


def attempt(job: dict[str, Any], material: bytes | list[Any] | None, tags: dict[str, str], options: dict[str, Any]) -> Iterator[Any]:
    """One try at one input. `material` is the bytes themselves, or the object refs of its chunks."""
    yield {"kind": "started", "node": node_id(), "t": time.time()}
    why = unready(job.get("image"))
    if why is not None:
        yield {"kind": "unready", "why": why}
        return
    spool = state_dir() / "cluster"
    spool.mkdir(parents=True, exist_ok=True)
    here = Path(tempfile.mkdtemp(prefix=f"{tags['run']}-{tags['attempt']}-", dir=spool))
    try:
        began = time.time()
        result, sessions = _run(job, _material(material, here), tags, options, here)
        ran = time.time() - began
        yield {"kind": "ended", "attempt": asdict(result), "sessions": [asdict(row) for row in sessions], "ran_s": ran, "t": time.time()}
        yield from _chunks("out", here / "out")
        yield from _chunks("err", here / "err")
        for row in sessions:
            yield from _chunks("tape:" + row.id, session_dir(row.id) / "tape.jsonl")
    finally:
        shutil.rmtree(here, ignore_errors=True)


def _material(material: bytes | list[Any] | None, here: Path) -> bytes | Path | None:
    """Bytes as they came; chunks gathered one at a time into a spool file the box's stdin pump reads."""
    if not isinstance(material, list):
        return material
    import ray

    path = here / "material"
    with open(path, "wb") as spooled:
        for ref in material:
            spooled.write(ray.get(ref))
    return path


def _run(job: dict[str, Any], material: bytes | Path | None, tags: dict[str, str], options: dict[str, Any], here: Path) -> tuple[Any, list[Any]]:
    from quinebox.agent.store import Index
    from quinebox.box.process import DEVNULL
    from quinebox.tree.fanout import Attempt, attempt_of
    from quinebox.tree.supervisor import start_agent

    with contextlib.ExitStack() as files:
        out = files.enter_context(open(here / "out", "wb"))
        err = files.enter_context(open(here / "err", "wb"))
        stdin: Any = files.enter_context(open(material, "rb")) if isinstance(material, Path) else material
        try:
            agent = start_agent(
                job["mission"], model=job.get("model"), grants=job.get("grants", ()), image=job.get("image"), timeout=job.get("timeout"),
                stdin=DEVNULL if stdin is None else stdin, stdout=out, stderr=err, tags=tags, **options,
            )
        except QuineboxError as exc:
            err.write(f"quinebox: {exc}\n".encode())
            return Attempt(exc.exit_code, termination=str(exc), engine_failed=isinstance(exc, EngineError)), []
        result = attempt_of(agent, agent.wait())
    index = Index()
    try:
        return result, index.subtree(result.session) if result.session else []
    finally:
        index.close()


def _chunks(kind: str, path: Path) -> Iterator[tuple[str, bytes]]:
    """The file in pieces of at most CHUNK bytes; an empty or missing file is one empty piece, so the driver still makes it."""
    try:
        with open(path, "rb") as source:
            piece = source.read(CHUNK)
            yield kind, piece
            while piece:
                piece = source.read(CHUNK)
                if piece:
                    yield kind, piece
    except FileNotFoundError:
        yield kind, b""
