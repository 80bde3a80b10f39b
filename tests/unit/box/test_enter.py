"""Which live box `quinebox enter` goes into, and who may."""

import os

import pytest

from quinebox.box.live.execs import find_box
from quinebox.box.owners.listing import BoxInfo
from quinebox.errors import QuineboxError

ME = str(os.getuid())


def box(session: str, user: str = ME) -> BoxInfo:
    return BoxInfo(session=session, container="c" + session, command="sh", state="running", owner="h:1:1", parent="", age_s=1.0, user=user)


@pytest.mark.parametrize(
    "asked, boxes, found",
    [
        ("abc123", [box("abc123"), box("def456")], "abc123"),
        ("abc", [box("abc123"), box("def456")], "abc123"),  # a unique prefix will do
    ],
)
def test_a_unique_prefix_finds_the_box(asked, boxes, found):
    assert find_box(asked, boxes).session == found


@pytest.mark.parametrize(
    "asked, boxes, words",
    [
        ("zzz", [box("abc123")], "no live box 'zzz'"),
        ("a", [box("abc123"), box("abd456")], "or more than one starts so"),
        ("abc", [box("abc123", user="4242")], "started by another user (uid 4242): only its owner may enter it"),
        ("abc", [box("abc123", user="")], "started by another user (uid unknown)"),
    ],
)
def test_no_box_two_boxes_or_someone_elses_box_is_refused(asked, boxes, words):
    with pytest.raises(QuineboxError, match=words.replace("(", r"\(").replace(")", r"\)")):
        find_box(asked, boxes)
