"""The driver's side of a cluster that needs no cluster: addresses, forwarded names, Ray kept off the plain path."""

import subprocess
import sys

import pytest

from quinebox.cluster.connect import forwarded_env, ray_address
from quinebox.errors import ErrorKind, QuineboxError


@pytest.mark.parametrize(
    "given, environ, expected",
    [
        ("ray://head:10001", {}, "ray://head:10001"),
        ("ray://10.0.0.5:10001", {"RAY_ADDRESS": "x:1"}, "ray://10.0.0.5:10001"),
        ("head.example:6379", {}, "head.example:6379"),
        ("10.1.2.3:6379", {}, "10.1.2.3:6379"),
        ("[::1]:6379", {}, "[::1]:6379"),
        ("auto", {}, "auto"),
        ("auto", {"RAY_ADDRESS": "ray://elsewhere:10001"}, "ray://elsewhere:10001"),
    ],
)
def test_cluster_addresses(given, environ, expected):
    assert ray_address(given, environ) == expected


@pytest.mark.parametrize("given", ["", "head", "http://head:8265", "head:port", "ray:/head:1", "; rm -rf /", "head:6379/x"])
def test_bad_cluster_addresses_say_what_to_give(given):
    with pytest.raises(QuineboxError) as bad:
        ray_address(given, {})
    assert (bad.value.kind, dict(bad.value.fields)) == (ErrorKind.BAD_INPUT, {"option": "--cluster", "address": given})
    assert "give ray://HOST:PORT" in str(bad.value)  # the wording is the point: what to give


@pytest.mark.parametrize(
    "names, environ, expected",
    [
        ([], {"OPENAI_API_KEY": "k"}, {}),  # nothing unless named
        (["OPENAI_API_KEY"], {"OPENAI_API_KEY": "k", "OTHER": "o"}, {"OPENAI_API_KEY": "k"}),
        (["A", "B"], {"A": "1", "B": ""}, {"A": "1", "B": ""}),
        (["_x1"], {"_x1": "v"}, {"_x1": "v"}),
    ],
)
def test_forwarded_environment(names, environ, expected):
    assert forwarded_env(names, environ) == expected


@pytest.mark.parametrize(
    "name, environ, kind",
    [
        ("MISSING", {}, ErrorKind.NOT_FOUND),  # it is not set here
        ("A=B", {"A": "x"}, ErrorKind.BAD_INPUT),  # not the name of an environment variable
        ("1ABC", {"1ABC": "x"}, ErrorKind.BAD_INPUT),
        ("", {}, ErrorKind.BAD_INPUT),
    ],
)
def test_bad_forwarded_names_are_one_line(name, environ, kind):
    with pytest.raises(QuineboxError) as caught:
        forwarded_env([name], environ)
    assert (caught.value.kind, dict(caught.value.fields)) == (kind, {"option": "--forward-env", "name": name})
    assert "\n" not in str(caught.value)


def test_without_ray_a_cluster_is_one_line_saying_how_to_install_it():
    probe = (
        "import sys; sys.modules['ray'] = None\n"
        "from quinebox.cluster.connect import connect\n"
        "try:\n    connect('head:6379')\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert said == "QuineboxError --cluster needs Ray, and it is not installed: install Ray beside quinebox: pip install 'quinebox[ray]'\n"


def test_ray_stays_off_every_path_without_a_cluster():
    probe = (
        "import sys, quinebox, quinebox.cli, quinebox.api, quinebox.tree.fanout, quinebox.tree.supervisor\n"
        "from quinebox.cli import register; register()\n"
        "print(' '.join(m for m in sys.modules if m == 'ray' or m.startswith(('ray.', 'quinebox.cluster'))))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
