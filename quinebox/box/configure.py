"""From a checked spec to its container configuration: the image found, the guest runtime in place, the policy applied.

Shared by `BoxProcess`, which starts the box, and the pool, which works out
the shape of the boxes it keeps warm the same way, so both agree by
construction on what a box of a given request looks like.

On an OCI runtime the image is an unpacked root filesystem (rootfs.py): once it is unpacked, configuring a box
asks the engine nothing, and the guest runtime is the agent image's own /.quinebox, mounted from its rootfs.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from quinebox.box.images.lookup import resolve_image
from quinebox.box.policy import RUNTIME, BoxMount, ContainerConfig, container_config, native_arch
from quinebox.box.policy_oci import Rootless, oci_config
from quinebox.box.spec import DEFAULT_IMAGE, HOST_IMAGE, BoxSpec, ImageInfo, seccomp_base
from quinebox.errors import EngineError, ErrorKind, GrantError, ImageError

if TYPE_CHECKING:
    from quinebox.box.backends.docker.engine import DockerBackend
    from quinebox.box.backends.oci.idmap import IdRange


def configure(spec: BoxSpec, backend: DockerBackend) -> tuple[BoxSpec, ImageInfo, ContainerConfig]:
    """(the spec, its argv filled from the image when it had none; the image; the container configuration)."""
    from quinebox.box.images.guest_runtime import runtime_dir

    if spec.image == HOST_IMAGE:
        raise GrantError("--image host needs an OCI runtime (runc or runsc): the Docker engine cannot root a box in the host's own filesystem; use --backend oci (`quinebox doctor` says why it was not chosen)")

    ours = spec.image == DEFAULT_IMAGE  # quinebox's own image: never pulled, surely has /bin/sh
    image = resolve_image(backend, spec.image, pull=spec.pull, pullable=not ours)
    spec = with_argv(spec, image)
    runtime = runtime_dir(backend, DEFAULT_IMAGE, image_id=image.id if ours else None)
    return spec, image, container_config(spec, image=image, runtime=runtime, seccomp=seccomp_base(), arch=native_arch())


def configure_oci(spec: BoxSpec, runtime_name: str) -> tuple[BoxSpec, ImageInfo, dict[str, Any]]:
    """The same for an OCI runtime: (the spec, the image, its config.json), the image unpacked on first use."""
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


def unpacked_image(name: str, *, pull: str) -> tuple[ImageInfo, str]:
    """(the image, its unpacked root): with no engine call once it is unpacked (unless --pull always); with no
    engine to ask, from what root shared (shared.py: a user without the engine's socket) or its registry (registry.py)."""
    from quinebox.box.images import rootfs, shared, usage

    if pull != "always":
        known = rootfs.lookup(name)
        if known is not None:
            root = rootfs.unpacked(known.id)
            if root is not None:
                return known, usage.mark(str(root))
    from quinebox.box.backends.docker.engine import DockerBackend

    try:
        backend = DockerBackend.shared()
        image = resolve_image(backend, name, pull=pull, pullable=name != DEFAULT_IMAGE)
    except EngineError as exc:  # no engine to ask (none here, or not this user's): what root shared, or its registry
        if exc.kind not in (ErrorKind.UNREACHABLE, ErrorKind.TIMEOUT):
            raise  # an engine that answered and refused (or a bug reported as the engine) is itself, not "no engine"
        public = shared.lookup(name) if pull != "always" else None  # shared.py: copied into this user's cache as if pulled
        if public is not None:
            info, tree = public
            made = rootfs.unpack(info, "shared", lambda root: shared.copy_into(root, tree))
            rootfs.remember(info, "shared")
            return info, usage.mark(str(made))
        if name == DEFAULT_IMAGE:
            raise EngineError(f"image {name} is not here, and the engine cannot be asked ({str(exc).rstrip('.')}): or have root share it (`sudo quinebox image share`)",
                              kind=ErrorKind.NOT_FOUND, image=name) from exc
        if pull == "never":
            raise ImageError(f"image {name} is not here: --pull never forbids pulling it, and the engine cannot be asked ({str(exc).rstrip('.')})",
                             kind=ErrorKind.NOT_FOUND, image=name) from exc
        from quinebox.box.images import registry

        image = registry.pull(name, str(exc).rstrip("."))
        return image, usage.mark(str(rootfs.unpacked(image.id)))
    return image, usage.mark(str(rootfs.from_engine(backend, image)))


def with_argv(spec: BoxSpec, image: ImageInfo) -> BoxSpec:
    """A spec with no argv runs its image's entrypoint and command."""
    if spec.argv:
        return spec
    if not image.entrypoint and not image.cmd:
        raise GrantError(f"nothing to run: image {spec.image} has no entrypoint or command; give one, as in `quinebox exec --image {spec.image} -- CMD`")
    return replace(spec, argv=(*image.entrypoint, *image.cmd))
