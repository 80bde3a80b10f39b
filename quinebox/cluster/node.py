"""What a worker node runs: its readiness check, and one attempt at one input.

An attempt is a Ray streaming generator. Its first object says where it ran and how: that the
node cannot run boxes at all (its engine or the image failed the box's start), or how the agent
ended and which sessions its tree made. When the deliverable, the diagnostics and the sessions'
tapes are small together they ride along in that object; otherwise they follow in pieces of at
most CHUNK bytes, so no process ever holds a whole deliverable. The boxes run as in a local `map`
(their owner is this Ray worker, so they die with it through their lifelines) and carry the run,
input and attempt as labels. Everything spooled here is gone when the attempt is.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from quinebox.errors import EngineError, ImageError, QuineboxError
from quinebox.processes import owner_tag
from quinebox.state import cluster_dir, session_dir

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
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.images.agent_image import image_exists
    from quinebox.box.spec import DEFAULT_IMAGE

    name = image or DEFAULT_IMAGE
    try:
        backend = DockerBackend.shared()
        backend.ping()
        if not image_exists(backend, name):
            return f"image {name} is not on node {host_name()}: build or load it there (`quinebox image build` for quinebox's own)"
    except QuineboxError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 an engine that stopped answering between requests
        return f"the engine on node {host_name()} did not answer: {exc}"
    return None


def check(image: str | None = None) -> dict[str, Any]:
    """`quinebox doctor --cluster`: this node, and why it cannot run boxes (None when it can)."""
    return {"node": node_id(), "host": host_name(), "why": unready(image)}


def collect_garbage() -> list[str]:
    """This node's `quinebox gc`, after a stop: a worker killed between a box's create and its start leaves it created, never run."""
    from quinebox.box.owners.gc import collect_garbage as collect

    return collect()


def attempt(job: dict[str, Any], material: bytes | list[Any] | None, tags: dict[str, str], options: dict[str, Any]) -> Iterator[Any]:
    """One try at one input. `material` is the bytes themselves, or the object refs of its chunks."""
    spool = cluster_dir() / owner_tag()
    spool.mkdir(parents=True, exist_ok=True)
    here = Path(tempfile.mkdtemp(prefix=f"{tags['run']}-{tags['attempt']}-", dir=spool))
    try:
        began = time.time()
        result, sessions = _run(job, _material(material, here), tags, options, here)
        ran = time.time() - began
        if isinstance(result, str):
            yield {"kind": "unready", "node": node_id(), "why": result}
            return
        files = {"out": here / "out", "err": here / "err", **{"tape:" + row.id: session_dir(row.id) / "tape.jsonl" for row in sessions}}
        sizes = {kind: path.stat().st_size if path.exists() else 0 for kind, path in files.items()}
        small = sum(sizes.values()) <= CHUNK  # the usual case: everything in the one object that says how it ended
        yield {
            "kind": "ended", "node": node_id(), "attempt": asdict(result), "sessions": [asdict(row) for row in sessions], "ran_s": ran,
            "inline": {kind: path.read_bytes() if sizes[kind] else b"" for kind, path in files.items()} if small else None,
        }
        if not small:
            for kind, path in files.items():
                yield from _chunks(kind, path)
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
    """How the agent ended and the sessions of its tree; or, when this node cannot run boxes at all, why not (and no sessions)."""
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
        except (EngineError, ImageError) as exc:  # the node's engine or image, not the input: another node may do
            return f"node {host_name()}: {exc}", []
        except QuineboxError as exc:
            err.write(f"quinebox: {exc}\n".encode())
            return Attempt(exc.exit_code, termination=str(exc)), []
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
