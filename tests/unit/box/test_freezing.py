"""Pausing a box (box/live/freezing.py): which freezer file a cgroup hierarchy has, and the marker execs read."""

import pytest

from quinebox.box.backends.oci import freezer
from quinebox.box.live import freezing
from quinebox.errors import EngineError, QuineboxError


@pytest.mark.parametrize(
    "made, control, word, done, said",
    [
        (["freezer/quinebox-b1", "unified/quinebox-b1"], "freezer/quinebox-b1/freezer.state", "FROZEN", "freezer/quinebox-b1/freezer.state", "FROZEN"),
        (["unified/quinebox-b1"], "unified/quinebox-b1/cgroup.freeze", "1", "unified/quinebox-b1/cgroup.events", "frozen 1"),
        (["quinebox-b1"], "quinebox-b1/cgroup.freeze", "1", "quinebox-b1/cgroup.events", "frozen 1"),
    ],
    ids=["v1 (hybrid, as here)", "hybrid without a v1 freezer", "v2"],
)
def test_the_freezer_of_each_hierarchy(tmp_path, made, control, word, done, said):
    for group in made:
        (tmp_path / group).mkdir(parents=True)
        if not group.startswith("freezer"):
            (tmp_path / group / "cgroup.freeze").write_text("0")
    assert freezer.freezer_files("/quinebox-b1", tmp_path) == (tmp_path / control, word, tmp_path / done, said)
    assert freezer._WORDS[word] != word and freezer._WORDS[said] != said


def test_no_freezer_is_said_in_one_line(tmp_path):
    with pytest.raises(EngineError, match=r"^no cgroup freezer for /quinebox-b1 here \(neither v1's freezer nor cgroup.freeze\): the box cannot be paused$"):
        freezer.freezer_files("/quinebox-b1", tmp_path)


def test_a_marked_box_refuses_execs_in_one_line_by_its_id_or_the_start_of_it(tmp_path, monkeypatch):
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    freezing.refuse_if_paused("0123456789ab")
    freezing.mark("0123456789ab", freezing.PAUSED, since=5.0)
    assert freezing.pause_of("0123456789ab") == freezing.Pause(5.0, "paused")
    for ref in ("0123456789ab", "0123"):
        with pytest.raises(QuineboxError, match=r"^box 0123456789ab is paused: `quinebox box resume 0123456789ab` first$"):
            freezing.refuse_if_paused(ref)
    freezing.mark("0123456789ab", freezing.CHECKPOINT)
    with pytest.raises(QuineboxError, match=r"^box 0123456789ab is paused while a checkpoint of it is taken: run the command again in a moment$"):
        freezing.refuse_if_paused("0123456789ab")
    freezing.unmark("0123456789ab")
    freezing.refuse_if_paused("0123456789ab")
    assert freezing.pause_of("0123456789ab") is None


def test_the_idle_clock_stands_still_while_paused(tmp_path, monkeypatch):
    from quinebox.box.live import sandboxes

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path))
    freezing.idle_clock_stood("0123456789ab", 1000.0, 30.0)  # never used: from its making on
    assert sandboxes.used("0123456789ab", 1000.0) == 1030.0
    freezing.idle_clock_stood("0123456789ab", 1000.0, 5.0)  # used (as a holder reads it) 35 s after its making
    assert sandboxes.used("0123456789ab", 1000.0) == 1035.0
