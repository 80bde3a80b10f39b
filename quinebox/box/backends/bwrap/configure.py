"""The bwrap backend's configure step: from a checked spec to a BwrapBox (policy.py) and what its start needs.

The image unpacked on first use (box/configure.py's unpacked_image), the spec's argv filled in (with_argv), and who
runs bwrap: as root, an unprivileged host uid and gid of the box's own, claimed as a runc box's are
(backends/oci/idmap.py through oci/configure.py's own_ids/inherited_ids: a child shares its parent's span); as a
plain user, that user, who needs user namespaces and a delegated cgroup (backends/rootless.py, refused in one
line otherwise). A box bwrap cannot hold is refused in one line by policy.py (UNSUPPORTED), before any id is
claimed or anything is made. Ranked at configure's tier (tests/unit/test_layout.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quinebox.box.backends.bwrap.policy import BwrapBox, bwrap_box, bwrap_refusal, proc_kinds
from quinebox.box.backends.bwrap.root import image_look
from quinebox.box.backends.oci.configure import enterable, inherited_ids, own_ids, rootless_user
from quinebox.box.backends.oci.policy import labels_for
from quinebox.box.configure import has_native_init, unpacked_image, with_argv
from quinebox.box.policy import CGROUP_PREFIX, RUNTIME, box_mounts, native_arch, workdir_for
from quinebox.box.spec import DEFAULT_IMAGE, BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import ErrorKind, QuineboxError

if TYPE_CHECKING:
    from quinebox.box.backends.oci.idmap import IdRange


@dataclass(frozen=True)
class BwrapConfig:
    """A configured bwrap box: its BwrapBox, the image's tree its root is made of, its own host ids (root) or None
    (a plain user's), its cgroup's path (relative to each hierarchy's root) and the labels its record carries."""

    box: BwrapBox
    image_root: str
    ids: IdRange | None
    cgroup: str
    labels: dict[str, str]


def configure_bwrap(spec: BoxSpec, *, lasting: bool = False) -> tuple[BoxSpec, ImageInfo, BwrapConfig]:
    """(the spec, its image, its BwrapConfig): refused in one line where bwrap cannot hold the box. `lasting`: it
    stays up for execs beside its command, which only init.py starts (policy.init_command)."""
    why = bwrap_refusal(spec)
    if why is not None:
        raise QuineboxError(f"refused on bwrap: {why}; use --backend oci", kind=ErrorKind.UNSUPPORTED, backend="bwrap", why=why)
    rootless = rootless_user()
    image, rootfs = unpacked_image(spec.image, pull=spec.pull)
    spec = with_argv(spec, image)
    agent_root = rootfs if spec.image == DEFAULT_IMAGE else unpacked_image(DEFAULT_IMAGE, pull="never")[1]
    ids = None
    if rootless is None:
        ids = inherited_ids(spec.parent, spec.session) or own_ids(spec.session)
    try:
        host_ids = (ids.host(spec.uid), ids.host(spec.gid)) if ids is not None else (os.getuid(), os.getgid())
        box = bwrap_box(
            spec, image=image, runtime=f"{agent_root}{RUNTIME}", seccomp=seccomp_base(), arch=native_arch(), image_root=rootfs,
            look=image_look(rootfs), host_ids=host_ids, proc=proc_kinds(), native_init=has_native_init(agent_root), lasting=lasting,
        )
        if ids is not None:  # a granted host directory its own host uid may not enter: refused in one line, as on runc
            binds = [{"type": "bind", "source": m.source, "destination": m.dest} for m in box_mounts(spec, runtime="") if m.kind == "bind"]
            enterable({"process": {"cwd": workdir_for(spec, image)}, "mounts": binds}, host_ids[0])
    except BaseException:
        if ids is not None:
            from quinebox.box.backends.oci.idmap import release

            release(ids, spec.session)
        raise
    name = f"{CGROUP_PREFIX}{spec.session}"
    cgroup = f"{rootless.cgroup.rstrip('/')}/{name}" if rootless is not None else f"/{name}"
    return spec, image, BwrapConfig(box=box, image_root=rootfs, ids=ids, cgroup=cgroup, labels=labels_for(spec))
