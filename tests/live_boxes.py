"""What the engine, the OCI runtimes and bubblewrap hold of quinebox's boxes, as the tests look at it."""

import glob
from types import SimpleNamespace

from quinebox.box.backends.bwrap.listed import bwrap_boxes
from quinebox.box.backends.oci.listed import runtime_boxes
from quinebox.box.policy import LABEL_OWNER, LABEL_PARENT, LABEL_SESSION
from quinebox.box.pool.claim import claimed_as
from quinebox.box.shape import LABEL_POOL


def cgroups_of(session: str) -> list[str]:
    """The host cgroups named for a box, in every hierarchy (its execs' are below them); a rootless box's are
    below its user's delegated one (rootless.delegated_name)."""
    return glob.glob(f"/sys/fs/cgroup/*/quinebox-{session}") + glob.glob(f"/sys/fs/cgroup/*/quinebox.user-*/quinebox-{session}")


def local_boxes() -> list[dict]:
    """The boxes of this state dir's local backends, in the engine's listing shape, as these tests compare them: the OCI
    runtimes' (runtimebox.runtime_boxes) and bubblewrap's (from its records: bwrap/listed.py)."""
    return [{"Id": b.id, "Labels": dict(b.labels), "Command": b.command, "State": b.state, "Runtime": b.backend} for b in [*runtime_boxes(), *bwrap_boxes()]]


def live_boxes(engine, label: str = "io.quinebox.session") -> list:
    """quinebox's containers as (status, labels) records, from one list call.

    docker-py's high-level list inspects each container afterwards, which
    races with boxes being removed: exactly what these tests watch for.
    A command server's warm boxes are left out until claimed; a claimed one
    carries the labels its claim record gives it, as `quinebox ps` shows it.
    """
    boxes = []
    # No engine in the rootless pass (conftest's `engine` is None there): its boxes are the runtimes' alone.
    for container in engine.api.containers(all=True, filters={"label": label}) if engine is not None else []:
        labels = claimed_labels(container)
        if labels is not None:
            boxes.append(SimpleNamespace(status=container["State"], labels=labels, id=container["Id"], backend="docker"))
    key, _, value = label.partition("=")
    for container in local_boxes():  # the test session's state dir: every box of the runtimes and bwrap these tests ran
        labels = claimed_labels(container)
        if labels is not None and key in labels and (not value or labels[key] == value):
            status = {"stopped": "exited"}.get(container["State"], container["State"])
            boxes.append(SimpleNamespace(status=status, labels=labels, id=container["Id"], backend=container["Runtime"]))
    return boxes


def claimed_labels(container: dict) -> dict | None:
    """A box's labels; a warm box's once claimed, as its claim record gives them; None for a warm box not claimed."""
    labels = container["Labels"]
    if LABEL_POOL not in labels:
        return labels
    record = claimed_as(container["Id"])
    if record is None:
        return None
    return {**labels, LABEL_SESSION: record["session"], LABEL_OWNER: record["owner"], LABEL_PARENT: record["parent"]}


def runs_in(box, needle: bytes) -> bool:
    """Whether a process whose command line holds `needle` runs in `box`, as the host's /proc shows it: its
    cgroup is the box's (named for the container's id, on the engine and on an OCI runtime)."""
    import os

    mark = box.id  # the engine's container, or the runtime's, whose cgroup is named as it is (a claimed box's too)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if needle not in f.read().replace(b"\0", b" "):
                    continue
            with open(f"/proc/{pid}/cgroup") as f:
                if mark in f.read():
                    return True
        except OSError:
            continue
    return False


def soon(listed, within: float = 1.0) -> list:
    """What `listed()` still shows once it shows nothing, or after `within` seconds. In-process, `wait` returns
    as soon as a box's init is reaped (every process of it is gone by then); its runtime state, cgroup and bundle
    go on the same thread just after, so a test that looks at once gives them that long."""
    import time

    until = time.monotonic() + within
    while (found := listed()) and time.monotonic() < until:
        time.sleep(0.01)
    return found
