"""`retention:` in config.yaml: its limits (table-tested, the size one by weights), and `due()`, which starts a
real `quinebox prune --retention` at most once a day, and nothing when no retention is set."""

import os
import subprocess
import sys
import time

import pytest
from stored import DAY, NOW, data, row, session

from quinebox.agent.store import Index
from quinebox.errors import ErrorKind
from quinebox.tree.retention import LOG, STAMP, Limits, RetentionError, Weights, due, over_size


@pytest.mark.parametrize(
    "config, limits",
    [
        ({"age": "30d"}, Limits(age=30 * DAY)),
        ({"count": 1000}, Limits(count=1000)),
        ({"count": 0}, Limits(count=0)),
        ({"size": "2g"}, Limits(size=2 << 30)),
        ({"age": "12h", "count": 5, "size": "512m"}, Limits(age=12 * 3600.0, count=5, size=512 << 20)),
        ({"images": "30d"}, Limits()),  # gc's alone (box/images/usage.py)
    ],
)
def test_retention_limits_from_config(config, limits):
    assert Limits.from_config(config) == limits


@pytest.mark.parametrize(
    "config, message",
    [
        ({}, "bad `retention:` in config.yaml: give one or more of age (7d), count (1000), size (2g) and images (30d)"),
        ("30d", "bad `retention:` in config.yaml: give one or more of age (7d), count (1000), size (2g) and images (30d)"),
        ({"age": "30d", "keep": 3}, "bad `retention:` in config.yaml: give one or more of age (7d), count (1000), size (2g) and images (30d)"),
        ({"age": "a month"}, "bad `retention:` in config.yaml: bad duration 'a month': use seconds or a unit ms, s, m, h or d (e.g. 30, 30s, 5m, 7d)"),
        ({"size": "big"}, "bad `retention:` in config.yaml: bad size 'big'"),
        ({"count": -1}, "bad `retention:` in config.yaml: count is how many finished sessions stay, a whole number 0 or more"),
        ({"count": "ten"}, "bad `retention:` in config.yaml: count is how many finished sessions stay, a whole number 0 or more"),
        ({"count": True}, "bad `retention:` in config.yaml: count is how many finished sessions stay, a whole number 0 or more"),
    ],
)
def test_a_retention_config_quinebox_cannot_mean_is_one_line(config, message):
    with pytest.raises(RetentionError) as raised:
        Limits.from_config(config)
    assert str(raised.value).startswith(message) and raised.value.exit_code == 2  # the wording is the point: what config.yaml may say
    assert raised.value.kind is ErrorKind.BAD_INPUT


@pytest.mark.parametrize(
    "limits, rows, going",
    [
        # any limit over is enough (prune's options, by contrast, must all hold)
        (Limits(age=7 * DAY, count=10), [row("old", ended=NOW - 8 * DAY), row("new", ended=NOW - DAY)], {"old"}),
        (Limits(age=7 * DAY, count=1), [row("a", started=NOW - 3 * DAY, ended=NOW - 2 * DAY), row("b", started=NOW - DAY, ended=NOW - 1)], {"a"}),
        (Limits(count=0), [row("a"), row("b", ended=None)], {"a"}),
    ],
)
def test_sessions_over_any_limit_are_candidates(limits, rows, going):
    assert limits.candidates(rows, NOW) == going


def test_the_size_limit_takes_the_oldest_until_sessions_and_their_objects_fit():
    weights = Weights(own={"a": 100, "b": 100, "c": 100}, objects={"a": {"x": 1000, "shared": 50}, "b": {"shared": 50}, "c": {"y": 10}})
    oldest_first = ["a", "b", "c"]
    total = 300 + 1000 + 50 + 10
    assert over_size(oldest_first, total, weights, set()) == set()
    assert over_size(oldest_first, total - 1, weights, set()) == {"a"}  # a frees 100 and x; shared stays with b
    assert over_size(oldest_first, 160, weights, set()) == {"a", "b"}  # b frees 100 and, last to name it, shared
    assert over_size(oldest_first, 0, weights, set()) == {"a", "b", "c"}
    assert over_size(oldest_first, 160, weights, {"a"}) == {"b"}  # what goes already counts first
    shared = Weights(own=weights.own, objects=weights.objects, shared=200)  # the index and run records: no session frees them
    assert over_size(oldest_first, total + 200, shared, set()) == set()
    assert over_size(oldest_first, total + 199, shared, set()) == {"a"}
    assert over_size(oldest_first, 360, shared, set()) == {"a", "b"}
    assert over_size(oldest_first, 199, shared, set()) == {"a", "b", "c"}  # over still: what is shared stays, as running sessions do


@pytest.fixture
def configured(tmp_path, monkeypatch):
    """A state dir and config dir of their own; QUINEBOX_SERVE=off, as the spawned prune has it."""
    monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / "config" / "quinebox").mkdir(parents=True)
    (tmp_path / "state").mkdir()
    return tmp_path / "state", tmp_path / "config" / "quinebox" / "config.yaml"


def indexed():
    index = Index()
    try:
        return sorted(r.id for r in index.every())
    finally:
        index.close()


def wait_until(predicate, timeout=60):
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_with_no_retention_set_nothing_starts_and_nothing_is_written(configured):
    state, _ = configured
    session("s-a", {})
    before = data(state)
    assert due() is False
    assert not (state / STAMP).exists() and not (state / LOG).exists() and data(state) == before


def test_retention_runs_in_a_process_of_its_own_once_a_day(configured):
    state, config = configured
    for n in range(3):
        session(f"s-{n}", {f"f{n}": b"bytes %d" % n}, age=(3 - n) * DAY)
    config.write_text("retention: {count: 1}\n")
    assert due() is True
    assert wait_until(lambda: indexed() == ["s-2"]), (state / LOG).read_text()
    assert (state / STAMP).exists()
    session("s-3", {}, age=0)
    assert due() is False  # ran within the day: one stat, and nothing more
    time.sleep(1)
    assert indexed() == ["s-2", "s-3"]
    old = time.time() - 2 * DAY
    os.utime(state / STAMP, (old, old))
    assert due() is True
    assert wait_until(lambda: indexed() == ["s-3"]), (state / LOG).read_text()


def test_every_quinebox_command_asks_as_it_ends_and_a_bad_retention_is_one_line_in_the_log(configured):
    state, config = configured
    session("s-old", {}, age=40 * DAY)
    config.write_text("retention: {age: 30d}\n")
    quinebox = os.path.join(os.path.dirname(sys.executable), "quinebox")
    env = {**os.environ, "QUINEBOX_SERVE": "off"}
    assert subprocess.run([quinebox, "ls"], capture_output=True, env=env, timeout=60).returncode == 0
    assert wait_until(lambda: indexed() == []), (state / LOG).read_text()
    config.write_text("retention: {age: soon}\n")
    os.unlink(state / STAMP)
    assert subprocess.run([quinebox, "ls"], capture_output=True, env=env, timeout=60).returncode == 0
    refusal = b"quinebox: bad `retention:` in config.yaml: bad duration 'soon'"
    assert wait_until(lambda: refusal in (state / LOG).read_bytes())
