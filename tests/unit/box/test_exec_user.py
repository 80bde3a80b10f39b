"""An exec's user in a live box (live/sandboxes.py): named, numbered, never root, and mapped by the box's user namespace."""

import pytest

from quinebox.box.live.sandboxes import exec_user, unmapped
from quinebox.errors import GrantError

PASSWD = b"root:x:0:0::/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\nodd:x:abc:1::/:/bin/sh\n"
RANGED = ([(0, 1), (1, 65536)], [(0, 1), (1, 65536)])  # a rootless box of a user with a subordinate range
SINGLE = ([(0, 1)], [(0, 1)])  # one without
OWN = ([(0, 65536)], [(0, 65536)])  # a root-made box: its own 65536 ids (backends/oci/idmap.py)


@pytest.mark.parametrize(
    "user, default, expected",
    [
        (None, "1000:1000", "1000:1000"),
        ("", "0:0", "0:0"),  # a rootless box's own user is its namespace's 0: the default, never asked for
        ("4242", "1000:1000", "4242:4242"),
        ("4242:7", "1000:1000", "4242:7"),
        ("agent", "1000:1000", "1000:1000"),
        ("agent:5", "1000:1000", "1000:5"),
        ("007", "1000:1000", "7:7"),
    ],
)
def test_a_user_is_a_uid_and_gid(user, default, expected):
    assert exec_user(user, default, PASSWD) == expected


@pytest.mark.parametrize(
    "user, said",
    [
        ("0", "nothing in a box runs as root"),
        ("root", "nothing in a box runs as root"),
        ("1000:0", "nothing in a box runs as root"),
        ("nobody-here", "no such user in the box's /etc/passwd"),
        ("odd", "no such user in the box's /etc/passwd"),  # its uid is not a number
        ("1000:staff", "give the group as a number"),
        # digits to str.isdigit, which int() refuses or reads: a name, and no such user (review 49, finding 8)
        ("⁰", "no such user in the box's /etc/passwd"),
        ("²:1000", "no such user in the box's /etc/passwd"),
        ("١٠٠٠", "no such user in the box's /etc/passwd"),
        ("1000:²", "give the group as a number"),
        ("agent:⁰", "give the group as a number"),
    ],
)
def test_a_bad_user_is_one_line(user, said):
    with pytest.raises(GrantError, match=said) as refused:
        exec_user(user, "1000:1000", PASSWD)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "resolved, ranges, said",
    [
        ("1000:1000", None, None),  # a gVisor box: no user namespace, every id is its sandbox's
        ("1000:1000", OWN, None),
        ("65535:65535", OWN, None),  # the span's last
        ("65536:1000", OWN, "this box's user namespace maps uids 0-65535 only"),
        ("1000:65536", OWN, "this box's user namespace maps gids 0-65535 only"),
        ("4000000:4000000", None, None),
        ("0:0", SINGLE, None),
        ("0:0", RANGED, None),
        ("1000:1000", RANGED, None),
        ("65536:65536", RANGED, None),  # the range's last
        ("65537:1", RANGED, "maps uids 0, 1-65536 only"),
        ("1:65537", RANGED, "maps gids 0, 1-65536 only"),
        ("1000:1000", SINGLE, "maps its user's own uid alone, as the box's 0; give its user a range (`sudo usermod --add-subuids"),
        ("0:1000", SINGLE, "maps its user's own gid alone"),
    ],
)
def test_an_id_the_box_does_not_map_is_refused_by_name(resolved, ranges, said):
    why = unmapped("someone", resolved, ranges)
    if said is None:
        assert why is None
    else:
        assert why is not None and why.startswith("refused user 'someone': this ") and said in why, why
        assert "\n" not in why


@pytest.mark.parametrize(
    "user, expected",
    [("root", "0:0"), ("0", "0:0"), ("0:0", "0:0"), ("1000:0", "1000:0"), ("root:5", "0:5"), ("agent", "1000:1000")],
)
def test_root_where_the_box_has_a_user_namespace_of_its_own(user, expected):
    assert exec_user(user, "1000:1000", PASSWD, no_root=None) == expected


@pytest.mark.parametrize("why", [
    "a box on the Docker engine has no user namespace of its own", "gVisor's box has no user namespace",
    "its user namespace maps the box's own user (1000:1000) alone, so no exec in it runs as another user, root included",
])
@pytest.mark.parametrize("user", ["root", "0", "1000:0", "0:1000"])
def test_root_elsewhere_is_refused_in_one_line_saying_why(user, why):
    with pytest.raises(GrantError) as refused:
        exec_user(user, "1000:1000", PASSWD, no_root=why)
    said = str(refused.value)
    assert said.startswith(f"refused user {user!r}: nothing in a box runs as root (uid or gid 0) but in a user namespace of its own that maps it, and this box's root cannot: {why};")
    assert "\n" not in said
