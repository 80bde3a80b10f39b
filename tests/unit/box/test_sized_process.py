"""A terminal exec on runc or crun is the box's own process, changed only where `exec`'s flags would change it."""

import pytest

from quinebox.box.backends.oci.listed import sized_process

BOX = {
    "args": ["/init"],
    "cwd": "/",
    "env": ["PATH=/usr/bin:/bin", "HOME=/home/agent"],
    "user": {"uid": 1000, "gid": 1000, "additionalGids": [5]},
    "capabilities": {"bounding": [], "effective": [], "permitted": []},
    "noNewPrivileges": True,
    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
    "terminal": False,
}


@pytest.mark.parametrize(
    ("user", "env", "uid", "gid"),
    [
        ("1000:1000", (), 1000, 1000),
        ("1001:1002", ("A=1",), 1001, 1002),
        ("1003", ("A=1", "B=2"), 1003, 1000),  # no group: the box's own, as `exec --user UID` keeps it
    ],
)
def test_only_the_exec_s_own_fields_change(user, env, uid, gid):
    got = sized_process(BOX, ["sh", "-c", "stty size"], "/world", env, user, (30, 100))
    assert got["args"] == ["sh", "-c", "stty size"]
    assert got["cwd"] == "/world"
    assert got["env"] == [*BOX["env"], *env]
    assert got["user"] == {"uid": uid, "gid": gid, "additionalGids": [5]}
    assert got["terminal"] is True
    assert got["consoleSize"] == {"height": 30, "width": 100}
    for kept in ("capabilities", "noNewPrivileges", "rlimits"):
        assert got[kept] == BOX[kept]  # never weaker than the box's own process
    assert BOX["args"] == ["/init"] and BOX["terminal"] is False  # the box's spec is not changed in place
