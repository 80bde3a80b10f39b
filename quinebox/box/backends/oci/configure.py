"""The OCI backend's configure step: from a checked spec to a runtime's config.json (backends/oci/policy.py), the
image unpacked on first use, a root-made box's own host ids claimed (idmap.py) or a plain user's box made rootless.
Ranked at configure's tier (tests/unit/test_layout.py); what every backend shares (the image's argv, an image
unpacked) is box/configure.py's."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING, Any

from quinebox.box.backends.oci.policy import Rootless, oci_config
from quinebox.box.configure import has_native_init, unpacked_image, with_argv
from quinebox.box.policy import RUNTIME, BoxMount, native_arch
from quinebox.box.spec import DEFAULT_IMAGE, HOST_IMAGE, BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import EngineError, GrantError

if TYPE_CHECKING:
    from quinebox.box.backends.oci.idmap import IdRange


def configure_oci(spec: BoxSpec, runtime_name: str, *, lasting: bool = False) -> tuple[BoxSpec, ImageInfo, dict[str, Any]]:
    """The same for an OCI runtime: (the spec, the image, its config.json), the image unpacked on first use.
    `lasting`: it stays up for execs beside its command, which only init.py starts (policy.init_command)."""
    hidden: list[BoxMount] = []
    rootless = rootless_user()
    if spec.image == HOST_IMAGE:
        from quinebox.box.images.host import ROOT, hidden_mounts, host_image

        image, rootfs, hidden = host_image(), ROOT, hidden_mounts(rootless=rootless is not None)
    else:
        image, rootfs = unpacked_image(spec.image, pull=spec.pull)
    spec = with_argv(spec, image)
    agent_root = rootfs if spec.image == DEFAULT_IMAGE else unpacked_image(DEFAULT_IMAGE, pull="never")[1]
    runtime = f"{agent_root}{RUNTIME}"
    gvisor = runtime_name == "runsc"
    ids = inherited_ids(spec.parent, spec.session) if rootless is None and not gvisor else None
    if ids is None and rootless is None and not gvisor:
        ids = own_ids(spec.session)
    try:
        config = oci_config(
            spec, image=image, runtime=runtime, seccomp=seccomp_base(), arch=native_arch(), rootfs=rootfs, gvisor=gvisor, hidden=hidden,
            rootless=rootless, userns=(ids.first, ids.span) if ids is not None else None,
            native_init=has_native_init(agent_root), lasting=lasting,
        )
        if ids is not None:
            enterable(config, ids.host(spec.uid))
    except BaseException:
        if ids is not None:
            from quinebox.box.backends.oci.idmap import release

            release(ids, spec.session)
        raise
    return spec, image, config



def enterable(config: dict[str, Any], uid: int) -> None:
    """Refuse in one line a box whose working directory is a granted host directory that its user, the host uid
    `uid` of its own (backends/oci/idmap.py), may not enter: the runtime would fail its start with a chdir error. Such a
    user is never the directory's owner, nor in its group, so the directory's bits for others are what count."""
    workdir = config["process"]["cwd"]
    binds = [m for m in config["mounts"] if m.get("type") == "bind" and (workdir == m["destination"] or workdir.startswith(m["destination"].rstrip("/") + "/"))]
    if not binds:
        return
    mount = max(binds, key=lambda m: len(m["destination"]))
    source = os.path.normpath(os.path.join(mount["source"], os.path.relpath(workdir, mount["destination"])))
    try:
        st = os.stat(source)
    except OSError:
        return  # the runtime says what is wrong with it
    if stat.S_ISDIR(st.st_mode) and st.st_uid != uid and not st.st_mode & 0o001:
        raise GrantError(
            f"the box's user, host uid {uid} (its own, no account's), may not enter its working directory {source} (mode {stat.S_IMODE(st.st_mode):04o}, "
            f"uid {st.st_uid}'s): `chmod o+x {source}` (o+rwx to let it write there), or work from another directory"
        )



def release_ids(config: dict[str, Any], session: str) -> None:
    """Give back the host ids a config of `session`'s claimed (own_ids), where it claimed any: once no box is made of it."""
    from quinebox.box.backends.oci.idmap import range_of, release

    ids = range_of(config.get("linux", {}).get("uidMappings"))
    if ids is not None:
        release(ids, session)



def inherited_ids(parent: str | None, session: str) -> IdRange | None:
    """The ids the child `session` shares with its parent's box, run by this process (backends/oci/idmap.py: a tree is
    one span), its claim on them joined to its parent's."""
    from quinebox.box.backends.oci.idmap import inherited, join

    ids = inherited(parent)
    if ids is not None:
        join(ids, session)
    return ids



def own_ids(session: str) -> IdRange:
    """A root-made box's own span of host ids (backends/oci/idmap.py); refused in one line where none can be had. A
    session that goes on (resumed) asks for the span its world's owner had, so its files stay its own."""
    from quinebox.box.backends.oci.idmap import claim, holding
    from quinebox.worlds.build import load_spec
    from quinebox.worlds.revisions import WorldError

    try:
        last = load_spec(session)[1].get("uid")
    except (WorldError, OSError, ValueError, KeyError):
        last = None
    try:
        return claim(session, prefer=holding(last) if isinstance(last, int) else None)
    except OSError as exc:
        raise EngineError(f"cannot give the box host ids of its own: {exc.strerror or exc}") from exc



def rootless_user() -> Rootless | None:
    """Who makes the box when it is not root (backends/rootless.py); refused in one line where they may not."""
    from quinebox.box.backends.rootless import Refusal, local_rootless

    who = local_rootless()
    if isinstance(who, Refusal):
        raise EngineError(f"cannot make a box as a user who is not root: {who.reason}; {who.fix}")
    return who
