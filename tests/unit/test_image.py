"""What the agent image is built from: the root Dockerfile and the stdlib-only guest code."""

import ast
import tarfile
from pathlib import Path

from quinebox.image import build_context
from quinebox.resources import guest_dir

STDLIB_ONLY = {"argparse", "os", "select", "signal", "socket", "sys", "json", "struct", "subprocess", "threading", "shutil", "protocol", "lifeline", "cli"}


def test_context_holds_the_dockerfile_and_every_guest_module():
    with tarfile.open(fileobj=build_context()) as tar:
        names = set(tar.getnames())
        dockerfile = tar.extractfile("Dockerfile").read().decode()
    assert "ARG BASE=debian:bookworm-slim" in dockerfile
    assert "COPY quinebox/guest/ /opt/quinebox/guest/" in dockerfile
    assert {f"quinebox/guest/{p.name}" for p in guest_dir().glob("*.py")} <= names
    assert "quinebox/guest/lifeline.py" in names


def test_the_image_installs_nothing_with_pip():
    with tarfile.open(fileobj=build_context()) as tar:
        assert "pip install" not in tar.extractfile("Dockerfile").read().decode()


def test_guest_code_imports_only_the_standard_library():
    for path in guest_dir().glob("*.py"):
        tree = ast.parse(Path(path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                modules = {(node.module or "").split(".")[0]}
            else:
                continue
            assert modules <= STDLIB_ONLY, f"{path.name} imports {modules - STDLIB_ONLY}"
