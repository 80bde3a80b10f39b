"""idview.image_tree: an idmapped view makes the host root's files the box root's, so it is made of an unpacked
image tree of quinebox's own cache and of nothing else (review 49, finding 3: the host's `/` was one)."""

import os

import pytest

from quinebox.box.backends.oci.idview import image_tree
from quinebox.errors import EngineError

HEX = "ab" * 32


@pytest.fixture
def cache(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(state))
    tree = state / "images" / HEX / "rootfs"
    (tree / "etc").mkdir(parents=True)
    (state / "images" / ("cd" * 32)).mkdir()
    (state / "images" / ("cd" * 32) / "rootfs").symlink_to("/")
    (state / "images" / ("ef" * 32)).mkdir()
    (state / "images" / ("ef" * 32) / "rootfs").write_text("")
    return state


def test_an_unpacked_image_tree_of_the_cache_is_viewed(cache):
    tree = cache / "images" / HEX / "rootfs"
    assert image_tree(str(tree)) == os.path.realpath(tree)
    assert image_tree(f"{cache}/images/{HEX}/rootfs/") == os.path.realpath(tree)


@pytest.mark.parametrize(
    "where",
    [
        "/",  # the host's own root: its secrets would be the box root's
        "/etc",
        "{state}",
        "{state}/images",
        "{state}/images/{hex}",
        "{state}/images/{hex}/rootfs/etc",  # inside a tree, not a tree
        "{state}/images/{hex}/rootfs/..",
        "{state}/images/{cd}/rootfs",  # a link in the cache out of it, to `/`
        "{state}/images/{ef}/rootfs",  # not a directory
        "{state}/images/{hex}/rootfs/../../{cd}/rootfs",
        "{state}/images/NOTHEX/rootfs",
        "/var/lib/quinebox/images/{hex}/rootfs",  # another cache than this state dir's
    ],
)
def test_anything_else_is_refused_in_one_line(cache, where):
    path = where.format(state=cache, hex=HEX, cd="cd" * 32, ef="ef" * 32)
    with pytest.raises(EngineError) as refused:
        image_tree(path)
    assert str(refused.value).startswith(f"refused an idmapped view of {path}:") and "\n" not in str(refused.value)
