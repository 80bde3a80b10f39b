"""Building the agent image, with or without a registry.

With a registry the base (`debian:bookworm-slim`) is pulled. Without one —
air-gapped hosts, and the machines this project is built on — the same
Debian release is bootstrapped with debootstrap and imported, and the same
Dockerfile builds on top of it.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import docker.errors

from quinebox.box.backends.docker.engine import DockerBackend
from quinebox.box.spec import DEFAULT_IMAGE
from quinebox.errors import ImageError
from quinebox.resources import guest_dir, resource_path

REGISTRY_BASE = "debian:bookworm-slim"
BOOTSTRAP_BASE = "quinebox/base:bookworm"
DEBIAN_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: What debootstrap adds to minbase: python3 for the guest; `python` (which agents, users and LangChain's sandbox
#: suite type) and patch for agents. The build on it then needs no network.
BOOTSTRAP_PACKAGES = ("python3", "python-is-python3", "patch")
#: Trimmed from the bootstrapped tree, as the slim image trims them.
SLIM_PATHS = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/lib/apt/lists", "var/cache/apt")

Log = Callable[[str], None]


def _say(message: str) -> None:
    print(f"quinebox: {message}", file=sys.stderr, flush=True)


def image_exists(backend: DockerBackend, name: str) -> bool:
    try:
        backend.api.inspect_image(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base(backend: DockerBackend, base: str | None, log: Log = _say) -> str:
    """A base image present locally: the one asked for, pulled, or bootstrapped offline."""
    if base:
        if not image_exists(backend, base):
            log(f"pulling {base}")
            try:
                backend.api.pull(base)
            except docker.errors.APIError as exc:
                raise ImageError(f"cannot pull base image {base}: {exc.explanation or exc}") from None
        return base
    for candidate in (REGISTRY_BASE, BOOTSTRAP_BASE):
        if image_exists(backend, candidate):
            return candidate
    log(f"pulling {REGISTRY_BASE}")
    try:
        backend.api.pull(REGISTRY_BASE)
        return REGISTRY_BASE
    except docker.errors.APIError as exc:
        log(f"cannot pull {REGISTRY_BASE} ({str(exc.explanation or exc).splitlines()[0]}); bootstrapping it with debootstrap")
    bootstrap_base(backend, log=log)
    return BOOTSTRAP_BASE


def bootstrap_base(backend: DockerBackend, log: Log = _say) -> None:
    """debootstrap a minimal Debian and import it as BOOTSTRAP_BASE."""
    debootstrap = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None)
    if not debootstrap:
        raise ImageError("no registry reachable and debootstrap is missing: install it (`apt-get install debootstrap`) or pass --base IMAGE")
    if os.geteuid() != 0:
        raise ImageError("bootstrapping the base image needs root (debootstrap creates device nodes and chroots): run `sudo quinebox image build`")
    mirror = os.environ.get("QUINEBOX_DEBIAN_MIRROR", DEFAULT_MIRROR)
    with tempfile.TemporaryDirectory(prefix="quinebox-rootfs-") as root:
        log(f"debootstrap {DEBIAN_SUITE} from {mirror} (about a minute)")
        cmd = [debootstrap, "--variant=minbase", f"--include={','.join(BOOTSTRAP_PACKAGES)}", DEBIAN_SUITE, root, mirror]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            tail = "\n".join(done.stdout.strip().splitlines()[-5:])
            raise ImageError(f"debootstrap failed (exit {done.returncode}):\n{tail}")
        for rel in SLIM_PATHS:
            path = Path(root, rel)
            if path.is_dir():
                for child in path.iterdir():
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        log(f"importing {BOOTSTRAP_BASE}")
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        repository, tag = BOOTSTRAP_BASE.split(":")
        try:
            backend.api.import_image(src=tar.stdout, repository=repository, tag=tag)
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar.wait()


def build_context() -> io.BytesIO:
    """The Dockerfile, the runtime's recipe, the guest code and the native init (when it builds here), as the tar
    the engine builds from."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(resource_path("Dockerfile"), arcname="Dockerfile")
        tar.add(resource_path("images", "runtime.sh"), arcname="images/runtime.sh")
        for path in sorted(guest_dir().rglob("*.py")):
            tar.add(path, arcname=f"quinebox/guest/{path.relative_to(guest_dir())}")
        with tempfile.TemporaryDirectory(prefix="quinebox-init-") as scratch:
            init = native_init(Path(scratch))
            if init is not None:
                tar.add(init, arcname="images/init")
    buf.seek(0)
    return buf


#: Compilers that link the native init statically, so it runs in a box of any image (any libc, or none): musl's
#: wrapper first (a ~40 KB binary), then the system compiler's own static libc.
STATIC_COMPILERS = (("musl-gcc", "-static"), ("cc", "-static"))


def native_init(scratch: Path) -> Path | None:
    """images/init.c built statically into `scratch`: the guest runtime's /.quinebox/bin/init, which a one-shot
    box on bwrap or runc runs instead of init.py's interpreter (policy.init_command). None where no compiler here
    builds it: then every box runs init.py, as before there was one."""
    source, made = resource_path("images", "init.c"), scratch / "init"
    for compiler, static in STATIC_COMPILERS:
        if shutil.which(compiler) is None:
            continue
        try:
            done = subprocess.run([compiler, static, "-O2", "-s", "-o", str(made), str(source)], capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return made
    return None


def build_image(backend: DockerBackend, *, tag: str = DEFAULT_IMAGE, base: str | None = None, log: Log = _say) -> str:
    base_image = ensure_base(backend, base, log)
    log(f"building {tag} on {base_image}")
    try:
        for chunk in backend.api.build(
            fileobj=build_context(), custom_context=True, tag=tag, buildargs={"BASE": base_image}, rm=True, decode=True
        ):
            if "error" in chunk:
                raise ImageError(f"building {tag} failed: {chunk['error'].strip()}")
    except docker.errors.APIError as exc:
        raise ImageError(f"building {tag} failed: {exc.explanation or exc}") from None
    log(f"built {tag}")
    return tag
