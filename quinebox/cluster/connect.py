"""The driver's link to a Ray cluster: where it is, what it can run at once, what a node may be told.

Ray is imported here and only here on the driver, when `--cluster` (or `cluster=`) asks for it;
without it quinebox never touches Ray. A node's capacity is the custom resource `quinebox`
(`ray start --resources '{"quinebox": 16}'`): each input's task needs one unit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quinebox.errors import ErrorKind, QuineboxError

#: The custom resource a node advertises: how many boxes it runs at once.
RESOURCE = "quinebox"
#: How long connecting may take before the cluster counts as unreachable.
CONNECT_TIMEOUT = 30.0
INSTALL_HINT = "install Ray beside quinebox: pip install 'quinebox[ray]'"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Cluster:
    """A connected cluster. `forwarded` is the environment every node's attempts get: only what the user named."""

    address: str
    ray: Any
    forwarded: dict[str, str] = field(default_factory=dict)

    def capacity(self) -> int:
        """Boxes the cluster runs at once: the sum of its nodes' `quinebox` resource."""
        return int(self.ray.cluster_resources().get(RESOURCE, 0))

    def check_nodes(self, image: str | None = None, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Each live node that advertises the resource, checked on the node itself: {node, host, why} (why None: ready)."""
        from quinebox.cluster.node import check

        pending = self._on_each_node(check, image)
        ready, _ = self.ray.wait(list(pending.values()), num_returns=len(pending), timeout=timeout)
        reports = []
        for node, ref in pending.items():
            try:
                reports.append(self.ray.get(ref) if ref in ready else {"node": node, "host": "?", "why": f"it did not answer within {timeout:.0f} s"})
            except self.ray.exceptions.RayError as exc:
                reports.append({"node": node, "host": "?", "why": f"its check failed: {first_line(exc)}"})
        return reports

    def collect_garbage(self, timeout: float = 60.0) -> None:
        """Run `quinebox gc` on every node that runs boxes, and wait (up to `timeout`) for them all; a node that fails it is left to its own gc."""
        from quinebox.cluster.node import collect_garbage

        pending = list(self._on_each_node(collect_garbage).values())
        self.ray.wait(pending, num_returns=len(pending), timeout=timeout)

    def _on_each_node(self, function: Any, *args: Any) -> dict[str, Any]:
        """`function(*args)` as a task pinned to each node that runs boxes: its ref per node id."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = self.ray.remote(function)
        return {
            node: remote.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)
            for node in self.box_nodes()
        }

    def box_nodes(self) -> list[str]:
        """The ids of the live nodes that advertise the resource."""
        return [node["NodeID"] for node in self.ray.nodes() if node.get("Alive") and node.get("Resources", {}).get(RESOURCE, 0) > 0]


def first_line(exc: BaseException) -> str:
    """Ray's errors run to many lines (tracebacks, hints): the first is what a one-line report needs."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def forwarded_env(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`--forward-env NAME`: the driver's value of each NAME, for the nodes' attempts (never the boxes)."""
    environ = os.environ if environ is None else environ
    chosen: dict[str, str] = {}
    for name in names:
        if not _NAME.match(name):
            raise QuineboxError(f"bad --forward-env {name!r}: give the name of an environment variable, as in --forward-env OPENAI_API_KEY",
                                kind=ErrorKind.BAD_INPUT, option="--forward-env", name=name)
        if name not in environ:
            raise QuineboxError(f"--forward-env {name}: it is not set here, so there is nothing to forward: export it first, or drop the option",
                                kind=ErrorKind.NOT_FOUND, option="--forward-env", name=name)
        chosen[name] = environ[name]
    return chosen


def ray_address(address: str, environ: Mapping[str, str] | None = None) -> str:
    """What `ray.init` is given: `ray://HOST:PORT` (Ray Client), `HOST:PORT` (the head's GCS), or `auto`."""
    environ = os.environ if environ is None else environ
    if address == "auto":
        return environ.get("RAY_ADDRESS") or "auto"
    if address.startswith("ray://") or re.match(r"^[A-Za-z0-9.\-\[\]:]+:\d+$", address):
        return address
    raise QuineboxError(f"bad --cluster {address!r}: give ray://HOST:PORT, the head's HOST:PORT, or auto (RAY_ADDRESS, or `ray start` on this machine)",
                        kind=ErrorKind.BAD_INPUT, option="--cluster", address=address)


def _init(ray: Any, target: str, address: str) -> None:
    """`ray.init`, with a deadline: against an address where nothing answers it would retry for minutes."""
    import logging
    import threading

    failed: list[BaseException] = []
    done = threading.Event()

    def init() -> None:
        try:
            ray.init(address=target, logging_level=logging.ERROR, log_to_driver=False)
        except BaseException as exc:  # noqa: BLE001 Ray's own errors are many: each becomes the one line below
            failed.append(exc)
        finally:
            done.set()

    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")  # Ray's C++ side would log every retry of a connection on stderr
    threading.Thread(target=init, name="quinebox-ray-init", daemon=True).start()
    if not done.wait(CONNECT_TIMEOUT):
        raise QuineboxError(f"the Ray cluster at {address} did not answer within {CONNECT_TIMEOUT:.0f} s: is its head running there (`ray status`)?",
                            kind=ErrorKind.TIMEOUT, address=address)
    if failed:
        raise QuineboxError(f"cannot reach the Ray cluster at {address}: {first_line(failed[0])}", kind=ErrorKind.UNREACHABLE, address=address) from failed[0]


def connect(address: str, forward: Iterable[str] = ()) -> Cluster:
    """Connect this process to the cluster once; one clear line when Ray is missing or the cluster cannot be reached."""
    target = ray_address(address)
    env = forwarded_env(forward)
    try:
        import ray
    except ImportError:
        raise QuineboxError(f"--cluster needs Ray, and it is not installed: {INSTALL_HINT}", kind=ErrorKind.UNSUPPORTED) from None
    if not ray.is_initialized():
        _init(ray, target, address)
    cluster = Cluster(address=address, ray=ray, forwarded=env)
    if cluster.capacity() < 1:
        raise QuineboxError(
            f"no node of the cluster at {address} runs boxes: start each worker with "
            f"ray start --address HEAD:PORT --resources '{{\"{RESOURCE}\": N}}' (N boxes at once), on a machine with an engine and quinebox's image"
        )
    return cluster
