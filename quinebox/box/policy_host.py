"""What a box of `--image host` sees of the host's own root: its programs and their configuration, nobody's data.

A pure function beside policy.py and backends/oci/policy.py. The box's root is the host's `/` as the read-only lower layer
of the box's own overlay (backends/oci/boxroot.py), so the developer's toolchain (compilers, interpreters, package
managers) is there at the paths it was installed to. What the host's root holds beyond that is hidden, and the
rule fails closed: every top-level directory not named in SHOWN is covered by an empty tmpfs, so a directory
this list never heard of (a `/data`, a `/work`, a `/backup`) shows nothing. Top-level files are covered by an
empty file; links are kept, as whatever they lead to in the box is shown or hidden by the same rule. Within /etc
the secrets a host keeps there are hidden too, although the box's user (never root) could not read most of them.

A rootless box (made by a user who is not root) cannot have the host's `/` as an overlay's lower layer: the
kernel will not clone, in a user namespace, a mount with mounts locked below it (/proc, /dev…), and `/` has
them. Its root is an empty directory of its own instead, the host's top-level links made in it (boxroot.py),
and each SHOWN directory bound into it read-only (`shown=True`); what is hidden is hidden alike. A grant whose
mount point would lie inside a shown directory and is not there on the host cannot be made in such a box.

All of it is mounts of the box's own, ordered by depth with its other mounts, not the runtime's maskedPaths: a
grant (`-g rw:.` in /home/dev/project) and the box's lifeline socket under /run land inside hidden directories,
and a runtime applies maskedPaths after every mount, covering those again.
"""

from __future__ import annotations

from collections.abc import Iterable

from quinebox.box.policy import BoxMount

#: The top-level directories of the host's root a box of `--image host` shows: where programs and their
#: configuration live (the FHS's, merged /usr or not; Nix's store and Snap's mounts where a host has them).
SHOWN = frozenset({"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "opt", "nix", "snap"})
#: Directories every box mounts its own over anyway (policy.SYSTEM_MOUNTS, policy.box_mounts).
OWN = frozenset({"proc", "sys", "dev", "tmp"})
#: The secrets a host keeps under /etc, hidden where present (an empty file over a file, an empty directory over
#: a directory); besides these, the private keys in /etc/ssh (`ssh_host_*_key`).
ETC_SECRETS = (
    "/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/security/opasswd",
    "/etc/sudoers", "/etc/sudoers.d", "/etc/ssl/private",
)
SSH_DIR = "/etc/ssh"
#: Why no box of `--image host` holds `rootfs:rw`: its root's lower layer would be the host's own `/`. Rootless, the
#: root is a plain directory of the bundle's on the state dir's disk (no overlay), unbounded; made by root, the
#: host's files would be the box's root's through an idmapped view, its secrets among them (ETC_SECRETS is a
#: denylist). Refused by rule, before anything is made.
HOST_ROOT_LAYER = "refused rootfs:rw with --image host: the host's own root is never a box's to write; write in a granted rw: path or /tmp, or use an image"
#: An empty directory of root's: nothing to read, and nothing the box's user (never root) can write.
HIDDEN_OPTIONS = ("nosuid", "nodev", "noexec", "size=64k", "nr_inodes=64", "mode=0755")
KINDS = ("dir", "file", "link")


def host_view(top: Iterable[tuple[str, str]], etc: Iterable[tuple[str, str]], empty: str, *, shown: bool = False) -> list[BoxMount]:
    """The mounts that hide what a box of `--image host` is not shown, for a host whose root holds `top`
    ((name, kind), kind one of KINDS, links not followed) and on which the paths `etc` ((path, kind): those of
    ETC_SECRETS and of SSH_DIR's entries that exist, links followed, "link" for one that leads nowhere) exist.
    `empty` is the host path of an empty read-only file, bound over files. `shown`: for a rootless box, whose
    root is empty, the SHOWN directories bound read-only too (before what hides inside them: same order)."""
    hidden = []
    for name, kind in sorted(top):
        if "/" in name or name in ("", ".", "..") or kind not in KINDS:
            raise ValueError(f"not an entry of the host's root: {name!r} ({kind})")
        if shown and kind == "dir" and name in SHOWN:
            hidden.append(BoxMount("bind", f"/{name}", f"/{name}"))
        elif kind != "link" and name not in SHOWN | OWN:
            hidden.append(_hide(f"/{name}", kind, empty))
    for path, kind in sorted(etc):
        if kind not in KINDS:
            raise ValueError(f"not a kind of entry: {path!r} ({kind})")
        parent, _, name = path.rpartition("/")
        secret = path in ETC_SECRETS or (parent == SSH_DIR and "_key" in name and not name.endswith(".pub"))
        if secret and kind != "link":
            hidden.append(_hide(path, kind, empty))
    return hidden


def _hide(path: str, kind: str, empty: str) -> BoxMount:
    return BoxMount("tmpfs", path, options=HIDDEN_OPTIONS) if kind == "dir" else BoxMount("bind", path, empty)
