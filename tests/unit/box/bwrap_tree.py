"""A `root.Look` of a tree said as a dict, for the pure tables of bwrap's root and policy (no image on disk)."""

import os

#: An image's tree as the box would see it: a directory (its mode), or a link (its target as written); files "file".
IMAGE = {
    "/bin": "-> usr/bin", "/etc": 0o755, "/etc/hostname": "file", "/proc": 0o555, "/dev": 0o755, "/tmp": 0o1777,
    "/run": 0o755, "/run/lock": 0o1777, "/usr": 0o755, "/usr/bin": 0o755, "/var": 0o755, "/var/run": "-> /run",
    "/opt": 0o711, "/opt/a": 0o755, "/opt/b": "file",
}
IMAGE_ROOT = "/state/images/sha256-agent/rootfs"


class TreeLook:
    def __init__(self, tree: dict):
        self.tree = tree

    def __call__(self, path: str):
        path = os.path.normpath(path)
        if path == "/":
            return "dir"
        kind = self.tree.get(path)
        return None if kind is None else "link" if isinstance(kind, str) and kind.startswith("-> ") else "file" if kind == "file" else "dir"

    def entries(self, path: str) -> tuple[str, ...]:
        return tuple(sorted(p.rsplit("/", 1)[1] for p in self.tree if os.path.dirname(p) == path))

    def target(self, path: str) -> str:
        return self.tree[path].removeprefix("-> ")

    def mode(self, path: str) -> int:
        return self.tree[path]


LOOK = TreeLook(IMAGE)
