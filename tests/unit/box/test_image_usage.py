"""When each unpacked image was last used, and which ones `gc` lets go of under `retention: {images:}`."""

import os
import stat
import time

import pytest

from quinebox.box.images.usage import USED, idle_limit, last_used, mark, unused
from quinebox.errors import QuineboxError

DAY = 86400.0


def image(root, name, *, used_ago=None, unpacked_ago=0.0):
    path = root / (name * 64)[:64]
    (path / "rootfs").mkdir(parents=True)
    when = time.time() - unpacked_ago
    os.utime(path, (when, when))
    if used_ago is not None:
        (path / USED).write_bytes(b"")
        then = time.time() - used_ago
        os.utime(path / USED, (then, then))
        os.utime(path, (when, when))
    return path


def test_a_box_taking_an_images_root_marks_its_use_beside_the_tree_never_in_it(tmp_path):
    path = image(tmp_path, "a")
    root = str(path / "rootfs")
    assert mark(root) == root and (path / USED).exists() and os.listdir(root) == []
    old = time.time() - DAY
    os.utime(path / USED, (old, old))
    mark(root)
    assert time.time() - last_used(path) < 60


def test_a_cache_the_user_cannot_write_is_not_marked_and_nothing_fails(tmp_path):
    path = image(tmp_path, "b")
    os.chmod(path, stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert mark(str(path / "rootfs")) == str(path / "rootfs")
        assert os.getuid() == 0 or not (path / USED).exists()
    finally:
        os.chmod(path, 0o755)


@pytest.mark.parametrize(
    "used_ago, unpacked_ago, in_use, goes",
    [
        (2 * DAY, 9 * DAY, False, True),
        (0.5 * DAY, 9 * DAY, False, False),  # used within the day
        (2 * DAY, 9 * DAY, True, False),  # a live box runs on it
        (None, 2 * DAY, False, True),  # never used since marking began: from its unpack
        (None, 0.5 * DAY, False, False),
    ],
)
def test_which_images_have_gone_unused(tmp_path, used_ago, unpacked_ago, in_use, goes):
    path = image(tmp_path, "c", used_ago=used_ago, unpacked_ago=unpacked_ago)
    assert unused(tmp_path, DAY, {path.name} if in_use else set()) == ([path] if goes else [])


def test_only_unpacked_images_count(tmp_path):
    (tmp_path / ".making-1-2-x").mkdir()
    (tmp_path / ("d" * 64)).mkdir()  # no rootfs/ yet: being made, or debris rootfs.prune takes
    assert unused(tmp_path, 0, set()) == [] and unused(tmp_path / "none", 0, set()) == []


@pytest.mark.parametrize(
    "config, limit",
    [(None, None), ("retention: {age: 7d}\n", None), ("retention: {images: 30d}\n", 30 * DAY), ("retention: {images: 12h}\n", 12 * 3600.0)],
)
def test_the_idle_limit_is_retentions_images(tmp_path, monkeypatch, config, limit):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    if config:
        (tmp_path / "quinebox").mkdir()
        (tmp_path / "quinebox" / "config.yaml").write_text(config)
    assert idle_limit() == limit


def test_a_bad_idle_limit_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "quinebox").mkdir()
    (tmp_path / "quinebox" / "config.yaml").write_text("retention: {images: a while}\n")
    with pytest.raises(QuineboxError, match=r"^bad `retention: \{images:\}` in config.yaml: bad duration 'a while'"):
        idle_limit()
