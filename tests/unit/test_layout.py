"""The package's rooms and the one direction of their imports, read from the source.

    cli, api → cluster → tree → agent → box → worlds → audit → foundation (errors, grants, state, …)
    box/: live → owners → run → pool → configure → images → backends → rules → net → streams
    guest: stdlib only, importable by the host (the frame format), never importing it

Every import counts, lazy ones inside functions included: a lazy import that
points up is still a circle waiting to happen. Names under `if TYPE_CHECKING:`
count for circles too (a circle of types is still two modules that each need
the other), and are exempt only from the direction of the rooms (see
`test_imports_point_down_or_sideways_never_up`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import quinebox

PACKAGE = Path(quinebox.__file__).parent
#: Rooms from the bottom up; a module may import its own room and the ones below it.
ROOMS = [
    ("foundation", ("quinebox.errors", "quinebox.processes", "quinebox.resources", "quinebox.documents", "quinebox.state", "quinebox.fdpass", "quinebox.netrules", "quinebox.grants", "quinebox.untar")),
    ("guest", ("quinebox.guest",)),
    ("audit", ("quinebox.audit",)),
    ("worlds", ("quinebox.worlds",)),
    # box/, its rooms from the bottom up; its flat modules in three tiers (see quinebox/box/__init__.py)
    ("box.streams", ("quinebox.box.streams", "quinebox.box.backends.docker.attached")),  # the engine's stdio, in its room
    ("box.net", ("quinebox.box.net",)),
    # A backend's rendering of the policy (backends/oci/policy.py) is ranked with the rules; its configure step with configure.
    ("box rules", ("quinebox.box.options", "quinebox.box.spec", "quinebox.box.policy", "quinebox.box.backends.oci.policy", "quinebox.box.backends.bwrap.policy", "quinebox.box.backends.bwrap.root", "quinebox.box.policy_host", "quinebox.box.shape")),
    ("box.backends", ("quinebox.box.backends",)),
    ("box.images", ("quinebox.box.images",)),
    ("box.configure", ("quinebox.box.configure", "quinebox.box.backends.docker.configure", "quinebox.box.backends.oci.configure", "quinebox.box.backends.bwrap.configure")),
    # A backend is one room (box/backends/docker/, box/backends/oci/), its modules ranked where they reach: its
    # warm boxes and claims at the pool's tier, its launch at run's, the rest (thin layer, box) at backends'.
    ("box.pool", ("quinebox.box.pool", "quinebox.box.backends.docker.warm", "quinebox.box.backends.oci.warm", "quinebox.box.backends.oci.claim")),
    ("box.run", ("quinebox.box.run", "quinebox.box.backends.docker.launch", "quinebox.box.backends.oci.launch", "quinebox.box.backends.bwrap.launch")),
    # Each backend's object (seam.Backend) reaches its own launch (run/) and warm (pool/) modules: it and the one
    # registry of them rank above those; the pool's keeper, which makes every backend's warm boxes, above it.
    ("box.backends registry", ("quinebox.box.backends.registry", "quinebox.box.backends.docker.backend", "quinebox.box.backends.oci.backend", "quinebox.box.backends.bwrap.backend")),
    ("box.pool keeper", ("quinebox.box.pool.keeper",)),
    ("box.owners", ("quinebox.box.owners",)),
    ("box.live", ("quinebox.box.live",)),
    ("box", ("quinebox.box",)),
    ("agent", ("quinebox.agent",)),
    ("tree", ("quinebox.tree",)),
    ("cluster", ("quinebox.cluster",)),
    ("front", ("quinebox.api", "quinebox.sandbox", "quinebox.cli", "quinebox.client", "quinebox.__main__", "quinebox.integrations", "quinebox.view", "quinebox")),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def room(module: str) -> int:
    """The rank of the room whose longest prefix holds `module` (a module ranked alone wins over its package's room)."""
    found = [(len(prefix), rank) for rank, (_, prefixes) in enumerate(ROOMS) for prefix in prefixes
             if prefix != "quinebox" and (module == prefix or module.startswith(prefix + "."))]
    if found:
        return max(found)[1]
    if module == "quinebox":
        return len(ROOMS) - 1
    raise AssertionError(f"{module} is in no room: add it to ROOMS in {__file__}")


def runtime_nodes(tree: ast.AST, typing: bool = False):
    """Every node except those under `if TYPE_CHECKING:` (with `typing`, those too)."""
    for node in ast.iter_child_nodes(tree):
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *runtime_nodes(child)])
            continue
        yield node
        yield from runtime_nodes(node, typing)


def imports_of(module: str, typing: bool = False) -> set[str]:
    """The quinebox modules `module` imports when it runs; with `typing`, also those it names only for the type checker."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text()), typing):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    found.add(f"{base}.{alias.name}")
                elif alias.name != "__version__":  # the version is the root package's only plain value
                    found.add(base)
    return {name for name in found if name == "quinebox" or name.startswith("quinebox.")}


GRAPH = {module: imports_of(module) - {module} for module in MODULES}
#: With the names under `if TYPE_CHECKING:`: what the circles are looked for in.
TYPED_GRAPH = {module: imports_of(module, typing=True) - {module} for module in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_or_sideways_never_up(module):
    """Names under `if TYPE_CHECKING:` may point up: a lower room may name, in a signature, the thing above that
    drives it (a backend for the box's images, the agent's node for the CLI), since such a name is never imported
    when the code runs and so never loads the upper room on the lower one's path. A name both ways is still a
    circle, which `test_no_import_circles` refuses."""
    mine = room(module)
    for target in sorted(GRAPH[module]):
        assert target in MODULES, f"{module} imports {target}, which does not exist"
        assert room(target) <= mine, f"{module} ({ROOMS[mine][0]}) imports {target} ({ROOMS[room(target)][0]}): imports point down only"


def test_the_guest_imports_nothing_of_the_host():
    for module in (m for m in MODULES if m.startswith("quinebox.guest")):
        assert not GRAPH[module], f"{module} runs in boxes and imports {GRAPH[module]}"


def test_no_import_circles():
    """Not even through `if TYPE_CHECKING:`: two modules that each need the other's names are one idea in two
    files, or a type that belongs below both (a record of its own, or a Protocol in the lower one)."""
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycle = stack[stack.index(module) :] + [module]
            pytest.fail("import circle: " + " → ".join(cycle))
        if module in done:
            return
        for target in sorted(TYPED_GRAPH[module]):
            visit(target, [*stack, module])
        done.add(module)

    for module in sorted(MODULES):
        visit(module, [])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_room_and_module_says_what_it_holds(module):
    assert ast.get_docstring(ast.parse(MODULES[module].read_text())), f"{module} has no docstring"


#: The sandbox providers other people's frameworks load: thin adapters that stand on quinebox's public API alone
#: (what `quinebox` exports), so what they need is grown there once, for every caller, and kept.
ADAPTERS = tuple(f"quinebox.integrations.{name}" for name in ("inspect_sandbox", "inspect_config", "harbor", "openai_agents", "openai_agents_pty", "minisweagent", "deepagents", "smolagents", "swerex", "swerex_relay"))


@pytest.mark.parametrize("module", ADAPTERS)
def test_each_framework_provider_uses_only_the_public_api(module):
    assert module in MODULES, f"{module} is missing"
    private = sorted(t for t in imports_of(module, typing=True) if t != "quinebox" and not t.startswith("quinebox.integrations."))
    assert private == [], f"{module} imports {private}: use what `quinebox` exports (grow the public API where it lacks something)"


# -- the checker itself ------------------------------------------------------------------


def test_the_checker_sees_lazy_imports_and_type_checking_ones_apart(tmp_path, monkeypatch):
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from quinebox.tree.supervisor import Node\n"
        "def f():\n    from quinebox.agent import store\n"
    )
    monkeypatch.setitem(MODULES, "quinebox.box.fake", tmp_path / "fake.py")
    (tmp_path / "fake.py").write_text(source)
    assert imports_of("quinebox.box.fake") == {"quinebox.agent.store"}
    assert imports_of("quinebox.box.fake", typing=True) == {"quinebox.agent.store", "quinebox.tree.supervisor"}


def loaded_after(setup: str, names: tuple[str, ...]) -> list[str]:
    """Which of `names` a fresh interpreter has imported after running `setup`."""
    import subprocess
    import sys

    probe = f"import sys\n{setup}\nprint(' '.join(m for m in {names!r} if m in sys.modules))\n"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()


def test_the_exec_path_imports_no_sqlite_yaml_rich_openai_or_cryptography():
    """`quinebox exec` and `quinebox.exec` start in well under a second because these stay off their path."""
    loaded = loaded_after(
        "import quinebox.cli, quinebox.cli.box, quinebox.api, quinebox.box.process, quinebox.tree.supervisor",
        ("sqlite3", "yaml", "rich", "openai", "cryptography"),
    )
    assert loaded == [], f"the exec path imports {loaded}"


def test_a_box_on_an_oci_runtime_and_the_registry_import_no_docker_py():
    """A backend's room imports light (its package's __init__ is a docstring): asking the registry, and the whole path of
    a box on an OCI runtime, never loads docker-py; only the engine's thin layer (backends/docker/engine.py) does."""
    loaded = loaded_after(
        "import quinebox.box.backends.registry, quinebox.box.backends.docker, quinebox.box.backends.oci.launch, quinebox.box.backends.oci.listed",
        ("docker", "requests", "urllib3"),
    )
    assert loaded == [], f"the OCI path imports {loaded}"
    assert loaded_after("import quinebox.box.backends.docker.engine", ("docker",)) == ["docker"]


def test_every_command_registered_imports_no_optional_extra():
    """`quinebox --help` and a command server register every command: the view's and the traces' extras stay off that path."""
    loaded = loaded_after(
        "from quinebox.cli import register\nregister([])\nimport quinebox.cli.app as a\na.command()",
        ("starlette", "uvicorn", "opentelemetry", "playwright"),
    )
    assert loaded == [], f"registering every command imports {loaded}"


def test_the_thin_client_imports_neither_json_nor_the_socket_module():
    """The `quinebox` command handed to a server costs about a bare interpreter: fdpass.py speaks _socket and marshal,
    so nothing on its path pulls in json, socket, enum or re (each a slice of every command's start-up)."""
    loaded = loaded_after("import quinebox.client", ("json", "socket", "enum", "re", "typing", "pathlib"))
    assert loaded == [], f"the thin client imports {loaded}"


def test_the_top_level_is_a_front_door_of_at_most_twelve_flat_modules():
    """The package's top level is where a reader starts: the front doors (api, sandbox, client) and the foundation
    every room stands on. A new idea goes into a room; a module's size is a reviewer's call, never a test's."""
    flat = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert len(flat) <= 12, f"{len(flat)} flat modules at the top: {', '.join(flat)}"


def test_every_test_file_has_a_basename_of_its_own():
    """pytest imports test files by basename (the tests are not packages): two of one name stop the whole run."""
    tests = Path(__file__).resolve().parents[1]
    names: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
