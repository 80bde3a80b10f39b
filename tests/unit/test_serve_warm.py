"""The command server's warm-up does once what each bwrap box's worker would do again: compile the default box's
seccomp filter with libseccomp (~10 ms of CPU a box) and look at its image's tree. A worker is forked from the
server, so it inherits both caches; a cache filled in a worker dies with it."""

from __future__ import annotations

import json

import pytest

from quinebox.box.backends.bwrap import policy, programs
from quinebox.box.backends.bwrap.root import image_look
from quinebox.box.configure import unpacked_image
from quinebox.box.spec import build_spec
from quinebox.cli.serve import warm_bwrap


def test_the_default_bwrap_box_is_compiled_and_looked_at_once_in_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    unpacked_image(build_spec(["true"]).image, pull="never")  # as the state dir's first box unpacks it
    monkeypatch.setattr(programs, "_programs", {})
    image_look.cache_clear()
    warm_bwrap()
    assert len(programs._programs) == 1
    (key,) = programs._programs
    assert json.loads(key)["defaultAction"]  # a whole profile, as a box's configure renders it
    # narrowed to the box's own ids, as the worker's box.py compiles it (or each worker's first box compiles its own)
    assert any(rule["names"] == ["chown"] and rule.get("args") for rule in json.loads(key)["syscalls"])
    assert image_look.cache_info().currsize == 1
    compiled = []
    monkeypatch.setattr(policy, "compile_seccomp", lambda profile: compiled.append(profile) or b"")
    assert programs.seccomp_program(json.loads(key)) is programs._programs[key]  # the worker's call: no compile
    assert compiled == []


def test_a_warm_up_its_start_could_not_do_is_done_by_the_server_after_a_command(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new state dir's server starts before its image is unpacked (its first command's worker unpacks it): it tries
    the warm-up again after each command, so that the workers forked after the first compile nothing. Before, none
    did it and every worker of that server compiled its own filter, and imported pyseccomp (two `ldconfig -p`)."""
    from quinebox.box.pool.warm import Settings
    from quinebox.cli.server import WARM_TRIES, Server

    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(programs, "_programs", {})
    image_look.cache_clear()
    server = Server(Settings.from_config(None))
    assert warm_bwrap() is False  # nothing unpacked in this state dir yet
    server.warm_later = warm_bwrap
    server.warm_again()  # the first command's worker has not unpacked it yet: tried again after the next
    assert (server.warm_later, server.warm_tries, programs._programs) == (warm_bwrap, 1, {})
    unpacked_image(build_spec(["true"]).image, pull="never")  # a worker unpacked it
    server.warm_again()
    assert server.warm_later is None and len(programs._programs) == 1 and image_look.cache_info().currsize == 1
    server.warm_later, server.warm_tries = (lambda: False), 0  # a server that never unpacks (the Docker backend's)
    for _ in range(WARM_TRIES):
        server.warm_again()
    assert server.warm_later is None  # it stops trying: its workers do their own
