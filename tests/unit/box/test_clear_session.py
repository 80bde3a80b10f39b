"""What a resume waits for before its session's box starts again under the same name (owners/gc.clear_session):
the lost process's keeper or the engine is let finish removing the old box; nobody left to, it is removed here."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import pytest

from quinebox.box.owners import gc
from quinebox.box.policy import LABEL_OWNER, LABEL_SESSION
from quinebox.errors import QuineboxError
from quinebox.processes import owner_id

GONE = f"{socket.gethostname()}:999999999:1"


@dataclass
class Lost:
    """A box as a backend lists it; `destroy` takes it off the list."""

    session: str
    owner: str = GONE
    listed: list = field(default_factory=list)
    destroyed: int = 0
    id: str = "quinebox-x"
    command: str = ""
    state: str = "stopped"
    made: float = 0.0
    backend: str = "runc"

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_SESSION: self.session, LABEL_OWNER: self.owner}

    def destroy(self) -> bool:
        self.destroyed += 1
        self.listed.remove(self)
        return True


@pytest.fixture
def listed(monkeypatch):
    boxes: list[Lost] = []
    monkeypatch.setattr(gc, "every_box", lambda engine, connect: list(boxes))
    monkeypatch.setattr(gc, "reachable_engine", lambda engine: None)
    return boxes


def lost(boxes: list, session: str = "s1", owner: str = GONE) -> Lost:
    box = Lost(session, owner, boxes)
    boxes.append(box)
    return box


def test_a_keeper_at_work_is_let_finish(listed, monkeypatch):
    monkeypatch.setattr(gc, "keeper_runs", lambda: True)
    box = lost(listed)
    other = lost(listed, "another")
    threading.Timer(0.3, listed.remove, (box,)).start()  # the keeper deletes it
    gc.clear_session("s1", settle=10)
    assert box.destroyed == 0 and other.destroyed == 0


def test_with_no_keeper_left_the_box_is_removed_at_once(listed, monkeypatch):
    monkeypatch.setattr(gc, "keeper_runs", lambda: False)
    box = lost(listed)
    began = time.monotonic()
    gc.clear_session("s1", settle=10)
    assert box.destroyed == 1 and time.monotonic() - began < 5


def test_a_box_still_there_after_the_wait_is_removed_here(listed, monkeypatch):
    monkeypatch.setattr(gc, "keeper_runs", lambda: True)
    box = lost(listed)
    gc.clear_session("s1", settle=0.2)
    assert box.destroyed == 1


def test_a_box_whose_process_runs_is_never_touched(listed, monkeypatch):
    monkeypatch.setattr(gc, "keeper_runs", lambda: False)
    box = lost(listed, owner=owner_id())
    with pytest.raises(QuineboxError, match="still has a box"):
        gc.clear_session("s1", settle=0.2)
    assert box.destroyed == 0


def test_a_box_that_will_not_go_is_said_in_one_line(listed, monkeypatch):
    monkeypatch.setattr(gc, "keeper_runs", lambda: False)
    box = lost(listed)
    monkeypatch.setattr(Lost, "destroy", lambda self: False)
    with pytest.raises(QuineboxError, match="is still there after 0.4 s: `quinebox gc` removes it"):
        gc.clear_session("s1", settle=0.2)
    assert box in listed
