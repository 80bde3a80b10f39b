"""The CLI registers only the command a command line names: its table of commands must say where each one is."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quinebox.cli import COMMANDS


def registered() -> dict[str, set[str]]:
    """Each top-level command or group of the whole app, and the modules whose functions it runs, in a fresh interpreter."""
    probe = (
        "import json, typer\n"
        "from quinebox.cli import register\n"
        "from quinebox.cli.app import app, command\n"
        "register()\n"
        "group = command()\n"
        "def modules(cmd):\n"
        "    if hasattr(cmd, 'commands'):\n"
        "        return sorted({m for sub in cmd.commands.values() for m in modules(sub)})\n"
        "    return [cmd.callback.__module__] if cmd.callback else []\n"
        "print(json.dumps({name: modules(cmd) for name, cmd in group.commands.items()}))\n"
    )
    return {name: set(mods) for name, mods in json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout).items()}


#: A group whose commands come from more than the module the table names: that module imports these.
ALSO = {"box": {"quinebox.cli.sandboxes"}}  # snapshots.py adds its commands to sandboxes.py's group


def test_the_table_names_every_command_and_the_module_that_registers_it():
    found = registered()
    assert set(found) == set(COMMANDS)
    for name, modules in found.items():
        assert modules == {f"quinebox.cli.{COMMANDS[name]}", *ALSO.get(name, ())}, name


@pytest.mark.parametrize(
    ("argv", "loaded", "not_loaded"),
    [
        (["exec"], ["quinebox.cli.box"], ["quinebox.cli.agents", "quinebox.cli.fanout", "quinebox.cli.audit", "quinebox.cli.worlds"]),
        (["run"], ["quinebox.cli.agents"], ["quinebox.cli.box", "quinebox.cli.fanout"]),
        (["world"], ["quinebox.cli.worlds"], ["quinebox.cli.box", "quinebox.cli.agents"]),
        (["--help"], ["quinebox.cli.box", "quinebox.cli.agents", "quinebox.cli.worlds", "quinebox.cli.serve"], []),
        (["no-such-command"], ["quinebox.cli.box", "quinebox.cli.audit", "quinebox.cli.fanout"], []),
        ([], ["quinebox.cli.box", "quinebox.cli.agents"], []),
    ],
)
def test_a_command_line_registers_its_own_command_or_all_of_them(argv, loaded, not_loaded):
    probe = f"import sys\nfrom quinebox.cli import register\nregister({argv!r})\nprint(' '.join(m for m in sys.modules if m.startswith('quinebox.cli.')))"
    modules = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split())
    assert set(loaded) <= modules
    assert not set(not_loaded) & modules


def test_a_mistyped_command_still_gets_the_whole_list_and_exit_2():
    quinebox = str(Path(sys.executable).with_name("quinebox"))
    done = subprocess.run([quinebox, "exce", "--", "true"], capture_output=True, text=True, env={**os.environ, "QUINEBOX_SERVE": "off"}, timeout=60)
    assert done.returncode == 2
    assert "No such command 'exce'" in done.stderr
