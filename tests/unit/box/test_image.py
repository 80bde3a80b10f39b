"""What the agent image is built from: the root Dockerfile and the stdlib-only guest code."""

import ast
import sys
import tarfile
from pathlib import Path

from quinebox.box.images.agent_image import build_context
from quinebox.resources import guest_dir


def test_context_holds_the_dockerfile_and_every_guest_module():
    with tarfile.open(fileobj=build_context()) as tar:
        names = set(tar.getnames())
        dockerfile = tar.extractfile("Dockerfile").read().decode()
    assert "ARG BASE=debian:bookworm-slim" in dockerfile
    assert "COPY quinebox/guest/ /tmp/quinebox/guest/" in dockerfile
    assert "images/runtime.sh" in names
    assert {f"quinebox/guest/{p.name}" for p in guest_dir().glob("*.py")} <= names
    assert "quinebox/guest/lifeline.py" in names


def test_the_image_installs_nothing_with_pip():
    with tarfile.open(fileobj=build_context()) as tar:
        assert "pip install" not in tar.extractfile("Dockerfile").read().decode()


def test_guest_code_imports_only_the_standard_library():
    own = {path.stem for path in guest_dir().glob("*.py")}
    allowed = set(sys.stdlib_module_names) | own
    for path in guest_dir().glob("*.py"):
        tree = ast.parse(Path(path).read_text())
        # Only the type checker reads the guest as the package `quinebox.guest` (a box never runs these lines).
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING" for n in ast.walk(block)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) in typing_only and (node.module or "").startswith("quinebox.guest"):
                named = {alias.name for alias in node.names} if node.module == "quinebox.guest" else {node.module.rpartition(".")[2]}
                assert named <= own, f"{path.name} names {ast.unparse(node)} for the type checker"
                continue
            if isinstance(node, ast.Import):
                modules = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                modules = {(node.module or "").split(".")[0]}
            else:
                continue
            assert modules <= allowed, f"{path.name} imports {modules - allowed}"


def test_the_image_has_python_as_debian_names_it():
    """`python`, which agents, users and LangChain's sandbox suite type: Debian's python-is-python3, bootstrapped
    into the offline base, and installed by the build on a base without it (debian:bookworm-slim, an older base)."""
    from quinebox.box.images.agent_image import BOOTSTRAP_PACKAGES

    assert "python-is-python3" in BOOTSTRAP_PACKAGES
    with tarfile.open(fileobj=build_context()) as tar:
        dockerfile = tar.extractfile("Dockerfile").read().decode()
    assert 'command -v python >/dev/null || missing="$missing python-is-python3"' in dockerfile
