"""Images from an OCI registry with no engine on the path: `skopeo copy` into an OCI layout, unpacked as a file's.

For a machine, or a user, with no engine to ask: skopeo (Debian's package, on the containers/image library
that podman and buildah use) copies `--image REGISTRY/NAME:TAG` into a scratch OCI image layout, and
archives.py unpacks it into the rootfs cache. Each blob has been checked against its digest by skopeo, and a
name pinned by digest (`NAME@sha256:…`) against its manifest's. The config is checked against the image id and
each layer against the config's diff ids when it is unpacked. A registry on loopback is spoken to over plain
HTTP, as the engine does by default (it trusts 127.0.0.0/8 and ::1 as insecure registries). Any other registry
is reached over verified TLS only.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from dataclasses import replace

from quinebox.box.images import archives
from quinebox.box.images.rootfs import remember, scratch_dir
from quinebox.box.spec import ImageInfo
from quinebox.errors import ImageError

#: How long one pull may take before it is given up (a registry that stops answering mid-way).
DEADLINE = 600
#: The layout's one image, by the name skopeo gives it there.
REF = "image"


def registry_of(name: str) -> str:
    """The registry host (and port) an image name points at, as the engine parses names: a first component
    with a dot, a colon, or `localhost` is one; else Docker Hub."""
    first, slash, _ = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def on_loopback(registry: str) -> bool:
    """Whether `registry` (HOST[:PORT], an IPv6 address in brackets) is this machine's own loopback."""
    host = registry.rpartition("]")[0].lstrip("[") if registry.startswith("[") else registry.partition(":")[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def copy_argv(skopeo: str, name: str, layout: str) -> list[str]:
    """skopeo's command line that copies image `name` into the OCI layout directory `layout`."""
    plain = ["--src-tls-verify=false"] if on_loopback(registry_of(name)) else []
    return [skopeo, "copy", "--quiet", "--retry-times", "2", *plain, f"docker://{name}", f"oci:{layout}:{REF}"]


def pull(name: str, why: str) -> ImageInfo:
    """Image `name` from its registry into the rootfs cache, remembered under that name; `why` says why not the
    engine (its one line), for the message when this fails too. ImageError in one line when it cannot be had."""
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise ImageError(f"cannot pull {name}: {why}; and skopeo, which pulls without the engine, is not installed (apt-get install skopeo)")
    layout = str(scratch_dir(f"image {name}"))
    try:
        try:
            done = subprocess.run(copy_argv(skopeo, name, layout), stdin=subprocess.DEVNULL, capture_output=True, timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            raise ImageError(f"cannot pull {name}: its registry {registry_of(name)} did not finish within {DEADLINE} s") from None
        if done.returncode != 0:
            lines = done.stderr.decode(errors="replace").strip().splitlines() or [f"skopeo exited with {done.returncode}"]
            raise ImageError(f"cannot pull {name} (is a registry reachable?): skopeo, pulling from {registry_of(name)} without the engine ({why}), says: {lines[-1].strip()}")
        info = replace(archives.from_oci_layout(layout, REF), name=name)
    finally:
        shutil.rmtree(layout, ignore_errors=True)
    remember(info, "registry")
    return info
