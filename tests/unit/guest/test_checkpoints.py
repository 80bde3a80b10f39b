"""The box's init around a checkpoint (guest/checkpoints.py): what it answers `drop`, and when it dials again.

Imported flat from the guest's own directory, as a box's init imports it."""

import io
import sys

import pytest

from quinebox.resources import guest_dir

sys.path.insert(0, str(guest_dir()))
import checkpoints
import protocol


class Line:
    """The init's end of its lifeline: what it sent, and whether it closed it."""

    def __init__(self):
        self.sent = io.BytesIO()
        self.closed = False

    def sendall(self, data):
        self.sent.write(data)

    def close(self):
        self.closed = True

    def frames(self):
        reader = io.BytesIO(self.sent.getvalue())
        found = []
        while True:
            try:
                found.append(protocol.read_frame(reader)[0])
            except EOFError:
                return found


@pytest.fixture(autouse=True)
def nothing_held(monkeypatch):
    monkeypatch.setattr(checkpoints, "host_files", lambda: [])


def test_a_drop_lets_go_of_the_lifeline_then_dials_once_told():
    line, again = Line(), Line()
    dropped = checkpoints.let_go(line, None, lambda: again)
    assert line.frames() == [{"kind": "dropping"}] and line.closed
    assert dropped.redialled() is None  # not told yet
    dropped._told(checkpoints.REDIAL, None)
    assert dropped.redialled() is again and again.frames() == [{"kind": "hello", "role": "lifeline"}]


def test_a_file_of_the_hosts_held_keeps_the_lifeline_and_names_it(monkeypatch):
    held = ["pid 7 (sleep 600) holds files of the host's as fd 1 (an exec's stdin, stdout or stderr)"]
    monkeypatch.setattr(checkpoints, "host_files", lambda: held)
    line = Line()
    assert checkpoints.let_go(line, None, lambda: pytest.fail("dialled")) is None
    assert line.frames() == [{"kind": "kept", "held": held}] and not line.closed


def test_past_the_deadline_it_dials_untold(monkeypatch):
    monkeypatch.setattr(checkpoints, "REDIAL_WITHIN", 0.0)
    line, again = Line(), Line()
    dropped = checkpoints.let_go(line, None, lambda: again)
    assert dropped.redialled() is again
