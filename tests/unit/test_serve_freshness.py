"""When a command server must make way for a fresh one (cli/freshness.py), and how long it stays when idle (cli/serve.py)."""

import os

import pytest

from quinebox.cli.freshness import fingerprint
from quinebox.cli.serve import idle_after
from quinebox.errors import ErrorKind, QuineboxError


@pytest.fixture
def tree(tmp_path):
    package = tmp_path / "quinebox"
    (package / "box").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "box" / "policy.py").write_text("RULES = 1\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"old")
    site = tmp_path / "site-packages"
    site.mkdir()
    config = tmp_path / "config.yaml"
    return package, site, config


def print_of(tree):
    package, site, config = tree
    return fingerprint(str(package), [str(site)], str(config))


def later(path):
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


@pytest.mark.parametrize("change", [
    "edit a module in place (an editable install)",
    "add a module",
    "remove a module",
    "install a package beside it",
    "write config.yaml",
    "edit config.yaml",
    "remove config.yaml",
])
def test_what_a_fresh_process_would_load_differently_changes_it(tree, change):
    package, site, config = tree
    if "remove config" in change or "edit config" in change:
        config.write_text("pool: 2\n")
    before = print_of(tree)
    assert print_of(tree) == before  # nothing changed: the same, each time
    if change.startswith("edit a module"):
        (package / "box" / "policy.py").write_text("RULES = 2\n")
        later(package / "box" / "policy.py")
    elif change == "add a module":
        (package / "box" / "new.py").write_text("")
    elif change == "remove a module":
        (package / "box" / "policy.py").unlink()
    elif change.startswith("install"):
        (site / "newpkg").mkdir()
        later(site)
    elif change == "write config.yaml":
        config.write_text("serve: {idle: 1m}\n")
    elif change == "edit config.yaml":
        config.write_text("pool: 3\n")
        later(config)
    else:
        config.unlink()
    assert print_of(tree) != before, change


def test_bytecode_caches_do_not_count(tree):
    package, _, _ = tree
    before = print_of(tree)
    (package / "__pycache__" / "x.pyc").write_bytes(b"recompiled")
    (package / "box" / "__pycache__").mkdir()
    assert print_of(tree) == before


@pytest.mark.parametrize(("option", "configured", "seconds"), [
    (None, None, 900.0),
    ("30s", None, 30.0),
    ("5m", {"idle": "1h"}, 300.0),  # the option wins
    (None, {"idle": "1h"}, 3600.0),
    (None, {"idle": 90}, 90.0),
    (None, {}, 900.0),
    ("never", None, None),
    ("0", None, None),
    (None, {"idle": "never"}, None),
    (None, {"idle": 0}, None),
    (None, {"idle": False}, None),  # YAML's bare `off`
    ("off", {"idle": "1m"}, None),
])
def test_idle_time(option, configured, seconds):
    assert idle_after(option, configured) == seconds


@pytest.mark.parametrize(("option", "configured", "says"), [
    ("soon", None, "bad idle time for the command server: bad duration 'soon'"),
    (None, {"idle": "-1m"}, "bad idle time for the command server: bad duration '-1m'"),
    (None, {"idel": "1m"}, "bad `serve:` in config.yaml: give a mapping with idle"),
    (None, "15m", "bad `serve:` in config.yaml: give a mapping with idle"),
])
def test_a_bad_idle_time_is_one_line(option, configured, says):
    with pytest.raises(QuineboxError) as raised:
        idle_after(option, configured)
    assert str(raised.value).startswith(says) and "\n" not in str(raised.value)
    assert raised.value.kind is ErrorKind.BAD_INPUT
