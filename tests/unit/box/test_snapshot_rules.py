"""What a snapshot refuses before anything is stopped, by rule (box/live/snapshot_rules.py): one line each."""

import pytest

from quinebox.box.live.snapshot_rules import Facts, held_refusal, links_refusal, refusal, world_refusal

CRIU = "`criu check` fails on this kernel: vdso: Unexpected rt vDSO area bounds"


@pytest.mark.parametrize(
    "facts, said",
    [
        (Facts("b1", "runsc", "dir"), None),
        (Facts("b1", "runsc", None), None),  # a tmpfs /world: the image holds it
        (Facts("b1", "runc", "dir", criu=CRIU),
         f"box b1 runs on runc, whose checkpoints go through CRIU, and CRIU does not work here ({CRIU}); make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "crun", "dir", criu=None),
         "box b1 runs on crun, whose checkpoints go through CRIU, and quinebox takes snapshots on gVisor only; make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "docker", "dir"),
         "box b1 runs on the Docker engine, whose checkpoints need its experimental mode (off here: `dockerd --experimental`) and CRIU; make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "docker", "dir", experimental=True),
         "box b1 runs on the Docker engine, whose experimental checkpoints quinebox does not take (they go through CRIU, and a box's host socket with them); make the box with --runtime runsc (gVisor) to snapshot it"),
        (Facts("b1", "runsc", "dir", writable_root=True),
         "box b1 holds rootfs:rw: what it wrote to its root is in a layer of its own on the host, which a snapshot cannot carry"),
        (Facts("b1", "runsc", "dir", secrets=True),
         "box b1 holds secret: grants, whose placeholders and proxy authority are its own session's: a snapshot cannot carry them"),
        (Facts("b1", "runsc", "bind"),
         "box b1 works on a directory of yours as its /world (--world DIR), which a copy of it could not: give it a world of its own (--world-from) to snapshot it"),
        (Facts("b1", "runsc", "overlay"), "box b1's /world is a copy-on-write view of another box's world, which a snapshot cannot carry"),
        (Facts("b1", "docker", "bind", secrets=True), None),  # the backend is said first: the rest would not be asked
    ],
)
def test_refusal(facts, said):
    got = refusal(facts)
    if said is None and facts.where == "docker":
        assert got is not None and got.startswith("box b1 runs on the Docker engine")
    else:
        assert got == said


def test_what_the_box_holds_is_named_in_one_line_however_much():
    many = [f"pid {n} (sleep {n}) holds files of the host's as fd 1 (an exec's stdin, stdout or stderr)" for n in range(5)]
    line = held_refusal("b1", many)
    assert line.startswith("box b1 cannot be snapshotted now: gVisor restores no file of the host's but the box's own stdio, and pid 0 (sleep 0)")
    assert "pid 1 (sleep 1)" in line and "pid 2" not in line and "(and 3 more)" in line and "\n" not in line
    assert links_refusal("b1", 2).startswith("box b1 cannot be snapshotted now: 2 connection(s) from inside it to the host are open")
    assert world_refusal("b1", ["a FIFO at /world/a"]) == "box b1 cannot be snapshotted now: its world holds a FIFO at /world/a, which a snapshot cannot copy; remove it first"
