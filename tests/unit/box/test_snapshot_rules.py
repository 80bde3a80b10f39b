"""What a snapshot refuses before anything is stopped, by rule (box/live/snapshot_rules.py): one line each."""

import pytest

from quinebox.box.backends.boxes import Box
from quinebox.box.backends.docker.box import DockerBox
from quinebox.box.backends.oci.listed import RuntimeBox
from quinebox.box.backends.oci.runtime import Runtime
from quinebox.box.live.snapshot_rules import Facts, held_refusal, links_refusal, refusal, world_refusal

CRIU = "`criu check` fails on this kernel: vdso: Unexpected rt vDSO area bounds"


ENGINE_OFF = "whose checkpoints need its experimental mode (off here: `dockerd --experimental`) and CRIU"
ENGINE_ON = "whose experimental checkpoints quinebox does not take (they go through CRIU, and a box's host socket with them)"


@pytest.mark.parametrize(
    "facts, said",
    [
        (Facts("b1", "gVisor (runsc)", "dir"), None),
        (Facts("b1", "gVisor (runsc)", None), None),  # a tmpfs /world: the image holds it
        (Facts("b1", "runc", "dir", cannot=f"whose checkpoints go through CRIU, and CRIU does not work here ({CRIU})"),
         f"box b1 runs on runc, whose checkpoints go through CRIU, and CRIU does not work here ({CRIU}); make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "crun", "dir", cannot="whose checkpoints go through CRIU, and quinebox takes snapshots on gVisor only"),
         "box b1 runs on crun, whose checkpoints go through CRIU, and quinebox takes snapshots on gVisor only; make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "the Docker engine", "dir", cannot=ENGINE_OFF),
         "box b1 runs on the Docker engine, whose checkpoints need its experimental mode (off here: `dockerd --experimental`) and CRIU; make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "the Docker engine", "dir", cannot=ENGINE_ON),
         "box b1 runs on the Docker engine, whose experimental checkpoints quinebox does not take (they go through CRIU, and a box's host socket with them); make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "gVisor (runsc)", "dir", writable_root=True),
         "box b1 holds rootfs:rw: what it wrote to its root is in a layer of its own on the host, which a snapshot cannot carry"),
        (Facts("b1", "gVisor (runsc)", "dir", secrets=True),
         "box b1 holds secret: grants, whose placeholders and proxy authority are its own session's: a snapshot cannot carry them"),
        (Facts("b1", "gVisor (runsc)", "bind"),
         "box b1 works on a directory of yours as its /world (--world DIR), which a copy of it could not: give it a world of its own (--world-from) to snapshot it"),
        (Facts("b1", "gVisor (runsc)", "overlay"), "box b1's /world is a copy-on-write view of another box's world, which a snapshot cannot carry"),
        (Facts("b1", "the Docker engine", "bind", secrets=True, cannot=ENGINE_OFF), f"box b1 runs on the Docker engine, {ENGINE_OFF}; make the box with --runtime runsc (gVisor) to snapshot it"),  # the backend first
    ],
)
def test_refusal(facts, said):
    assert refusal(facts) == said


class _Engine:
    """The one engine answer a DockerBox's reason reads: whether its experimental mode is on."""

    def __init__(self, on: bool):
        self.on = on

    def experimental(self) -> bool:
        return self.on


@pytest.mark.parametrize("on, said", [(False, ENGINE_OFF), (True, ENGINE_ON)])
def test_the_engine_says_why_it_cannot_checkpoint(on, said):
    box = DockerBox(_Engine(on), {"Id": "c1", "Labels": {}})  # type: ignore[arg-type]
    assert not box.capabilities.checkpoint and box.why_not("checkpoint") == said


@pytest.mark.parametrize("name, checkpoint, user_namespace, host_processes", [("runc", False, True, True), ("runsc", True, False, False)])
def test_each_runtime_declares_what_its_boxes_can_do(name, checkpoint, user_namespace, host_processes):
    capabilities = Runtime(name, f"/usr/sbin/{name}").capabilities
    assert (capabilities.pause, capabilities.checkpoint, capabilities.own_user_namespace, capabilities.host_processes) == (True, checkpoint, user_namespace, host_processes)
    box = RuntimeBox(Runtime(name, f"/usr/sbin/{name}"), "quinebox-b1", {"quinebox.session": "b1"})
    if not user_namespace:
        assert box.why_not("own_user_namespace") == "gVisor's box has no user namespace, and its gofer makes root's files as the host's root"
    if checkpoint:
        assert box.checkpoint.__func__ is not Box.checkpoint  # type: ignore[attr-defined]  # it has the operation


def test_what_the_box_holds_is_named_in_one_line_however_much():
    many = [f"pid {n} (sleep {n}) holds files of the host's as fd 1 (an exec's stdin, stdout or stderr)" for n in range(5)]
    line = held_refusal("b1", many)
    assert line.startswith("box b1 cannot be snapshotted now: gVisor restores no file of the host's but the box's own stdio, and pid 0 (sleep 0)")
    assert "pid 1 (sleep 1)" in line and "pid 2" not in line and "(and 3 more)" in line and "\n" not in line
    assert links_refusal("b1", 2).startswith("box b1 cannot be snapshotted now: 2 connection(s) from inside it to the host are open")
    assert world_refusal("b1", ["a FIFO at /world/a"]) == "box b1 cannot be snapshotted now: its world holds a FIFO at /world/a, which a snapshot cannot copy; remove it first"
