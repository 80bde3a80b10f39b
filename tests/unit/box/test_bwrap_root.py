"""backends/bwrap/root.py: a bwrap box's read-only root made of the image's tree, as a table (a look of a tree said as a
dict), the look at a real tree, and real bwrap boxes over a real tree, as root and as an unprivileged uid: the tree is
byte- and mode-identical after, a mount point the image lacks works, and the image's links resolve in the box."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile

import pytest
from bwrap_argv import IMAGE_ROOT, LOOK

from quinebox.box.backends.bwrap.root import ROOT_TMPFS, image_look, root_argv, root_seal
from quinebox.errors import ErrorKind, QuineboxError

TMPFS = ("--size", str(ROOT_TMPFS), "--perms")


def bound(path: str) -> list[str]:
    return ["--ro-bind", IMAGE_ROOT + path, path]


#: The image's top-level entries as they are when nothing of a box lands among them.
TOP = {
    "/bin": ["--symlink", "usr/bin", "/bin"], "/dev": bound("/dev"), "/etc": bound("/etc"), "/opt": bound("/opt"),
    "/proc": bound("/proc"), "/run": bound("/run"), "/tmp": bound("/tmp"), "/usr": bound("/usr"), "/var": bound("/var"),
}


def top(*, but: tuple[str, ...] = (), **instead: list[str]) -> list[str]:
    """The root's tmpfs and the image's top-level entries in order, those in `but` left out, `instead` in place."""
    out = [*TMPFS, "0755", "--tmpfs", "/"]
    for path, argv in TOP.items():
        name = path[1:]
        out += instead.get(name, [] if path in but else argv)
    return out


#: The image's tree bound at / in one read-only mount: what every box whose top-level points the image has gets.
WHOLE = ["--ro-bind", IMAGE_ROOT, "/"]


@pytest.mark.parametrize(
    "dests, made, sealed",
    [
        ((), WHOLE, []),
        # every point the image has (a file or a directory, at the top or deeper) is mounted onto: the tree in one bind
        (("/proc", "/dev", "/tmp"), WHOLE, []),
        (("/etc/hostname", "/opt/a"), WHOLE, []),
        # a destination at the top the image lacks is made on the root's tmpfs; the image's entries there are left
        # out, link or not, and the rest bound back one by one
        (("/proc", "/dev", "/tmp", "/world", "/.quinebox"), top(but=("/proc", "/dev", "/tmp")), ["/"]),
        (("/bin",), top(but=("/bin",)), ["/"]),
        (("/etc/hostname", "/world"), top(), ["/"]),
        # the socket under /run, which lacks /run/quinebox: /run a tmpfs of its mode, its entries bound back
        (("/run/quinebox/host.sock",), [*WHOLE, *TMPFS, "0755", "--tmpfs", "/run", *bound("/run/lock")], ["/run"]),
        (("/world", "/run/quinebox/host.sock"), top(run=[*TMPFS, "0755", "--tmpfs", "/run", *bound("/run/lock")]), ["/run", "/"]),
        # a point under a directory deeper down: its parents stay the image's, the directory lacking it a tmpfs
        (("/opt/a/x/y",), [*WHOLE, *TMPFS, "0755", "--tmpfs", "/opt/a"], ["/opt/a"]),
        (("/world", "/opt/a/x/y"), top(opt=[*bound("/opt"), *TMPFS, "0755", "--tmpfs", "/opt/a"]), ["/opt/a", "/"]),
        # a file where a directory must be: the file left out of its directory's tmpfs, its siblings bound back
        (("/opt/b/x",), [*WHOLE, *TMPFS, "0711", "--tmpfs", "/opt", *bound("/opt/a")], ["/opt"]),
        # a link at the point itself: the mount replaces it, as a mount at the top replaces a top-level link
        (("/var/run",), [*WHOLE, *TMPFS, "0755", "--tmpfs", "/var"], ["/var"]),
        # under another destination: that mount's, not the image's
        (("/world", "/world/src", "/tmp", "/tmp/a/b"), top(but=("/tmp",)), ["/"]),
        (("/tmp", "/tmp/a/b"), WHOLE, []),
        # two points: deepest sealed first
        (("/run/quinebox/host.sock", "/opt/a/x"), [*WHOLE, *TMPFS, "0755", "--tmpfs", "/opt/a", *TMPFS, "0755", "--tmpfs", "/run", *bound("/run/lock")],
         ["/opt/a", "/run"]),
        (("/world", "/run/quinebox/host.sock", "/opt/a/x"), top(run=[*TMPFS, "0755", "--tmpfs", "/run", *bound("/run/lock")],
                                                                opt=[*bound("/opt"), *TMPFS, "0755", "--tmpfs", "/opt/a"]), ["/opt/a", "/run", "/"]),
    ],
)
def test_the_root_as_bwrap_options(dests, made, sealed):
    assert root_argv(IMAGE_ROOT, LOOK, dests) == made
    assert root_seal(LOOK, dests) == [arg for path in sealed for arg in ("--remount-ro", path)]


@pytest.mark.parametrize("dest, link", [("/var/run/x", "/var/run"), ("/bin/tool", "/bin")])
def test_a_mount_through_the_images_link_is_refused_in_one_line(dest, link):
    """bwrap would follow the link on the host's side while it sets up, so it is refused, not followed."""
    for call in (lambda: root_argv(IMAGE_ROOT, LOOK, [dest]), lambda: root_seal(LOOK, [dest])):
        with pytest.raises(QuineboxError) as refused:
            call()
        assert refused.value.kind == ErrorKind.UNSUPPORTED and refused.value.fields["link"] == link and "\n" not in str(refused.value)


# -- a real tree ------------------------------------------------------------------------------------------------------

def make_tree(*more: str) -> str:
    """An image's tree readable by any uid (not under pytest's 0700 tmp): a static busybox in /usr/bin, /bin -> usr/bin,
    /etc/hostname, /run/lock, /opt/a/file, /var/run -> /run, a link out of the tree, /escape -> /, and the
    directories `more`."""
    busybox = shutil.which("busybox")
    assert busybox, "busybox is not installed: apt-get install busybox-static (the test's image's only program)"
    root = tempfile.mkdtemp(prefix="quinebox-bwrap-root-")
    os.chmod(root, 0o755)
    for directory in ("usr/bin", "etc", "run/lock", "opt/a", "var", "tmp", *more):
        os.makedirs(os.path.join(root, directory))
    os.chmod(os.path.join(root, "run/lock"), 0o1777)
    os.chmod(os.path.join(root, "opt"), 0o711)
    shutil.copy(busybox, os.path.join(root, "usr/bin/busybox"))
    for path, text in (("etc/hostname", "image\n"), ("opt/a/file", "a\n")):
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    os.symlink("usr/bin", os.path.join(root, "bin"))
    os.symlink("/run", os.path.join(root, "var/run"))
    os.symlink("/", os.path.join(root, "escape"))
    return root


@pytest.fixture
def tree():
    root = make_tree()
    try:
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture(params=["tmpfs", "whole"])
def any_tree(request):
    """The tree without /proc and /dev (the box's root a tmpfs, the tree's entries bound into it), and with them (every
    top-level point the tree's own: the box's root is the tree, in one bind)."""
    root = make_tree(*(("proc", "dev") if request.param == "whole" else ()))
    try:
        yield root
    finally:
        shutil.rmtree(root)


def snapshot(root: str) -> dict[str, tuple]:
    """Every path of the tree: its type and mode, owner, mtime, and its bytes' digest (a link's target)."""
    seen = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files, ""]:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            content = os.readlink(path) if stat.S_ISLNK(st.st_mode) else hashlib.sha256(open(path, "rb").read()).hexdigest() if stat.S_ISREG(st.st_mode) else None
            seen[os.path.relpath(path, root)] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, content, sorted(os.listdir(path)) if stat.S_ISDIR(st.st_mode) else None)
    return seen


def test_the_look_at_a_real_tree_never_follows_a_link(tree):
    look = image_look(tree)
    assert look is image_look(tree)  # one per image: its answers are cached with it
    kinds = {p: look(p) for p in ("/", "/bin", "/usr/bin", "/usr/bin/busybox", "/etc/hostname", "/escape", "/escape/etc", "/bin/busybox", "/var/run/lock", "/nothing")}
    assert kinds == {"/": "dir", "/bin": "link", "/usr/bin": "dir", "/usr/bin/busybox": "file", "/etc/hostname": "file", "/escape": "link",
                     "/escape/etc": None, "/bin/busybox": None, "/var/run/lock": None, "/nothing": None}
    assert look.entries("/") == ("bin", "escape", "etc", "opt", "run", "tmp", "usr", "var")
    assert (look.target("/bin"), look.target("/escape"), look.mode("/opt"), look.mode("/run/lock")) == ("usr/bin", "/", 0o711, 0o1777)


INSIDE = r"""
cd /
for p in / /opt /run /etc /usr /opt/tool /tmp; do touch "$p/w" 2>/dev/null && echo "wrote $p" || echo "ro $p"; done
readlink /bin; cat /etc/hostname /opt/a/file /opt/tool/granted; for d in /opt /run /var/run/; do ls $d; done; echo ok > /tmp/x && cat /tmp/x
"""


def run_box(tree: str, as_uid: int | None) -> subprocess.CompletedProcess:
    """A box over `tree` as bwrap's caller `as_uid` (None: this process's own): a grant at /opt/tool (which the image
    lacks), a file at /run/quinebox/host.sock (under /run, which lacks /run/quinebox), /tmp its own."""
    grant = tempfile.mkdtemp(prefix="quinebox-bwrap-grant-")
    os.chmod(grant, 0o755)
    with open(os.path.join(grant, "granted"), "w") as f:
        f.write("granted\n")
    os.chmod(os.path.join(grant, "granted"), 0o644)
    dests = ["/proc", "/dev", "/tmp", "/opt/tool", "/run/quinebox/host.sock"]
    look = image_look(tree)
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--uid", "1000", "--gid", "1000", "--clearenv",
            *root_argv(tree, look, dests), "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", grant, "/opt/tool",
            "--ro-bind", os.path.join(grant, "granted"), "/run/quinebox/host.sock", *root_seal(look, dests), "--", "/bin/busybox", "sh", "-c", INSIDE]
    made = root_argv(tree, look, dests)
    assert (made[:3] == ["--ro-bind", tree, "/"]) is os.path.isdir(os.path.join(tree, "proc"))  # the one bind, or a tmpfs root
    who = {} if as_uid is None else {"user": as_uid, "group": as_uid, "extra_groups": []}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, **who)
    finally:
        shutil.rmtree(grant)


OUT = """ro /
ro /opt
ro /run
ro /etc
ro /usr
ro /opt/tool
wrote /tmp
usr/bin
image
a
granted
a
tool
lock
quinebox
lock
quinebox
ok
"""


@pytest.mark.parametrize("as_uid", [None, pytest.param(65534, marks=pytest.mark.root_only)], ids=["self", "nobody"])
def test_a_box_over_the_tree_writes_nothing_of_it(any_tree, as_uid):
    assert shutil.which("bwrap"), "bwrap is not installed: apt-get install bubblewrap (scripts/setup.sh installs it)"
    before = snapshot(any_tree)
    ran = run_box(any_tree, as_uid)
    assert (ran.returncode, ran.stderr) == (0, ""), ran.stderr
    assert ran.stdout == OUT
    assert snapshot(any_tree) == before, json.dumps(snapshot(any_tree), default=str)
