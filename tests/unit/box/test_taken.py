"""sandboxes.Taken: the host's own cap on what an exec of files.py sends, whatever the box writes into its stdout."""

import pytest

from quinebox.box.live.sandboxes import Taken


class Exec:
    kills = 0

    def kill(self):
        self.kills += 1


@pytest.mark.parametrize(
    "cap, chunks, passed, over",
    [
        (10, [b"12345", b"67890"], b"1234567890", False),
        (10, [b"12345", b"678901"], b"12345", True),
        (10, [b"12345678901"], b"", True),
        (0, [b""], b"", False),
        (0, [b"x"], b"", True),
        (4, [b"ab", b"cd", b"e", b"more"], b"abcd", True),
    ],
)
def test_nothing_past_the_cap_is_passed_on_and_the_exec_is_killed_once_past_it(cap, chunks, passed, over):
    got: list[bytes] = []
    taken, proc = Taken(got.append, cap), Exec()
    taken.watch(proc)
    for chunk in chunks:
        taken(chunk)
    assert (b"".join(got), taken.over, proc.kills) == (passed, over, 1 if over else 0)


def test_a_cap_passed_before_the_exec_is_known_kills_it_when_it_is():
    taken, proc = Taken(None, 2), Exec()
    taken(b"abc")
    taken.watch(proc)
    assert taken.over and proc.kills == 1 and taken.text() == "ab"


def test_nothing_is_taken_after_close():
    got: list[bytes] = []
    taken = Taken(got.append, 100)
    taken(b"a")
    taken.close()
    taken(b"late, from a box process holding the pipe")
    assert got == [b"a"]
