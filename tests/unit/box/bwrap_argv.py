"""bwrap's rendering for the pure tables (test_policy_bwrap.py, test_policy_oci.py, test_bwrap_root.py): a `root.Look`
of an image's tree said as a dict (no image on disk), bwrap_box over it, and bwrap's argv read back as options."""

import os

from test_policy import AGENT_IMAGE, ARCH, RUNTIME_DIR

from quinebox.box.backends.bwrap.policy import BwrapBox, bwrap_box
from quinebox.box.spec import BoxSpec, ImageInfo, seccomp_base

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


#: A host whose /proc has two masked directories, two masked files and two read-only paths (others absent).
PROC = {"/proc/acpi": "dir", "/proc/scsi": "dir", "/proc/keys": "file", "/proc/kcore": "file", "/proc/sys": "dir", "/proc/sysrq-trigger": "file"}
#: How many arguments each bwrap option the renderer uses takes (bwrap 0.8's --help).
ARITY = {
    "--unshare-all": 0, "--unshare-user": 0, "--die-with-parent": 0, "--as-pid-1": 0, "--new-session": 0, "--clearenv": 0,
    "--cap-drop": 1, "--uid": 1, "--gid": 1, "--hostname": 1, "--chdir": 1, "--seccomp": 1, "--size": 1, "--perms": 1,
    "--tmpfs": 1, "--proc": 1, "--dev": 1, "--mqueue": 1, "--remount-ro": 1, "--dir": 1, "--setenv": 2, "--bind": 2, "--ro-bind": 2, "--symlink": 2,
}
MOUNTS = ("--bind", "--ro-bind", "--tmpfs", "--proc", "--dev", "--mqueue", "--remount-ro", "--symlink")
TMP = 256 << 20


def bwrap(box: BoxSpec, image: ImageInfo = AGENT_IMAGE, **kw) -> BwrapBox:
    return bwrap_box(box, image=image, runtime=RUNTIME_DIR, seccomp=seccomp_base(), arch=ARCH, image_root=IMAGE_ROOT, look=LOOK, **({"host_ids": (1000, 1000), "proc": PROC} | kw))


def options(argv: list[str]) -> list[tuple[str, ...]]:
    """bwrap's options, each with its arguments, up to `--`; an option the table does not know fails the test."""
    assert argv[0] == "bwrap"
    out, i = [], 1
    while argv[i] != "--":
        n = ARITY[argv[i]]
        out.append(tuple(argv[i:i + n + 1]))
        i += n + 1
    return out


def command(argv: list[str]) -> list[str]:
    return argv[argv.index("--") + 1:]


def flags(argv: list[str]) -> list[str]:
    return [o[0] for o in options(argv)]


def mounts(argv: list[str]) -> list[tuple[str, ...]]:
    """The mount options in order, each with its --size/--perms folded in: ("--tmpfs", dest, size, perms)."""
    out, pending = [], {}
    for option in options(argv):
        if option[0] in ("--size", "--perms"):
            pending[option[0]] = option[1]
        elif option[0] in MOUNTS:
            out.append((*option, *((pending.pop("--size", None), pending.pop("--perms", None)) if option[0] == "--tmpfs" else ())))
    return out


def own(argv: list[str]) -> list[tuple[str, ...]]:
    """The box's own mounts: after /dev is made read-only, before the root is."""
    every = mounts(argv)
    start = every.index(("--remount-ro", "/dev")) + 1
    return [m for m in every[start:] if m[0] != "--remount-ro"]


def system(argv: list[str]) -> list[tuple[str, ...]]:
    """/proc and /dev: from /proc to /dev made read-only."""
    every = mounts(argv)
    return every[every.index(("--proc", "/proc")):every.index(("--remount-ro", "/dev")) + 1]


def root(argv: list[str]) -> list[tuple[str, ...]]:
    """The root's making (before /proc) and sealing (the read-only remounts after the box's own mounts)."""
    every = mounts(argv)
    start = every.index(("--remount-ro", "/dev")) + 1
    return every[:every.index(("--proc", "/proc"))] + [m for m in every[start:] if m[0] == "--remount-ro"]


def env(argv: list[str]) -> dict[str, str]:
    names = [o[1] for o in options(argv) if o[0] == "--setenv"]
    assert len(names) == len(set(names)), f"a name twice in {names}"
    return {o[1]: o[2] for o in options(argv) if o[0] == "--setenv"}
