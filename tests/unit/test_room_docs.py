"""Every room of the package says what it holds: each package's docstring (its __init__.py's) names every module in it.

A room's docstring is where a reader starts: a module it does not name is one the reader never learns is there.
The rule, the one the docstrings keep: a module is named by its file name (`fdpass.py`), a sub-package by its
directory's name and a slash (`streams/`), each anywhere in the docstring, in a sentence or a table. Read from
the source, as tests/unit/test_layout.py reads the imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import quinebox

PACKAGE = Path(quinebox.__file__).parent
ROOMS = sorted(path.parent for path in PACKAGE.rglob("__init__.py"))


def held(room: Path) -> list[str]:
    """What `room` holds, as its docstring is to name it: its modules' file names and its sub-packages' names with a slash."""
    modules = [path.name for path in room.glob("*.py") if path.name not in ("__init__.py", "__main__.py")]
    packages = [f"{path.parent.name}/" for path in room.glob("*/__init__.py")]
    return sorted(modules + packages)


def named(docstring: str, name: str) -> bool:
    """Whether `docstring` names `name` as a word of its own (`checks.py` is not named by `mcp_checks.py`)."""
    return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w])", docstring) is not None


@pytest.mark.parametrize("room", ROOMS, ids=lambda room: ".".join(room.relative_to(PACKAGE.parent).parts))
def test_each_rooms_docstring_names_every_module_it_holds(room):
    docstring = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
    missing = [name for name in held(room) if not named(docstring, name)]
    assert missing == [], f"{room.relative_to(PACKAGE.parent)}/__init__.py's docstring does not name {', '.join(missing)}: say what each holds"


def test_the_rule_tells_a_module_named_from_one_that_is_not():
    assert named("the frames (fdpass.py), and", "fdpass.py")
    assert named("    streams/   a box's bytes", "streams/")
    assert named("its thin client is ../client.py)", "client.py")
    assert not named("the checks (mcp_checks.py)", "checks.py")
    assert not named("fdpass.pyc", "fdpass.py")
    assert not named("the streams of a box", "streams/")
