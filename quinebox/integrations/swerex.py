"""SWE-ReX's deployment in a quinebox box: `swerex-remote` runs in the box, and only its caller reaches it.

SWE-agent drives a sandbox through SWE-ReX: an `AbstractDeployment` starts `swerex-remote` (a small HTTP server)
somewhere and hands back a `RemoteRuntime` that speaks to it. `DockerDeployment` publishes the server's port on
the host; a quinebox box has no network at all (only its own loopback), so nothing on the host can dial into it.
Here the server listens on the box's own 127.0.0.1 and a relay (swerex_relay.py: one exec in the box) carries
each connection the runtime opens on a host loopback port to it. Who gets through: this user's processes alone,
holding the deployment's own random token (swerex's X-API-Key), which never appears on a command line.

`swerex-remote` itself: SWE-ReX of the host's own version, installed once for the box's Python (its version,
machine and glibc, asked in the box) by the host's pip into a cache dir, and granted read-only into the box. No
image is built, any image with a CPython >= 3.10 on glibc serves, and a box's code cannot change the server's.

    deployment = QuineboxDeployment(grants=["mem:1g"])
    await deployment.start()
    await deployment.runtime.create_session(CreateBashSessionRequest())
    print(await deployment.runtime.run_in_session(BashAction(command="echo hi")))
    await deployment.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from swerex import PACKAGE_NAME, __version__
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import IsAliveResponse
from swerex.runtime.remote import RemoteRuntime
from swerex.utils.log import get_logger

from quinebox import PIPE, QuineboxError, Sandbox
from quinebox.integrations.swerex_relay import Relay

__all__ = ["QuineboxDeployment", "QuineboxDeploymentConfig"]

#: Where the host's install of SWE-ReX appears in the box (granted read-only).
BOX_DIR = "/opt/quinebox-swerex"
#: The longest pip may take to install SWE-ReX for a box's Python, the first time.
INSTALL_TIMEOUT = 600.0
#: The box's Python, as the install must match it: version, machine, glibc.
PROBE = "import platform,sys;print(platform.python_implementation(),sys.version_info[0],sys.version_info[1],platform.machine(),*platform.libc_ver())"
#: swerex-remote's own app (swerex.server), its token read from stdin (never on a command line another user's `ps`
#: shows), on a socket bound here to the box's loopback only: its port is the first line said.
SERVER = """import socket,sys
sys.path.insert(0,sys.argv[1])
token=sys.stdin.readline().strip()
if not token:sys.exit("no token on stdin: swerex-remote would serve anyone")
import uvicorn,swerex.server as server
server.AUTH_TOKEN=token
s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(("127.0.0.1",0));s.listen(128)
print(s.getsockname()[1],flush=True)
uvicorn.Server(uvicorn.Config(server.app,log_level="warning",access_log=False)).run(sockets=[s])
"""


class QuineboxDeploymentConfig(BaseModel):
    """What a `QuineboxDeployment` runs in: the box's options are `quinebox.Sandbox`'s (docs/python.md)."""

    image: str | None = None
    """The box's image (default: quinebox's agent image); it needs a CPython >= 3.10 on glibc as `python`."""
    pull: Literal["never", "always", "missing"] = "missing"
    """When to pull the image, as SWE-ReX's DockerDeploymentConfig says it."""
    grants: list[str] = []
    """quinebox grants (docs/grants.md): `ro:`/`rw:` paths, `net:` egress, `mem:`, `cpus:`, `rootfs:rw`, …"""
    workdir: str | None = None
    backend: str | None = None
    runtime: str | None = None
    ttl: float | str | None = None
    """The box's life at most (as `time:`); by default it lasts until `stop()` or this process's end."""
    name: str | None = None
    python: str = "python3"
    """The box's Python that runs swerex-remote and the relay."""
    user: str | None = None
    """Who swerex-remote, and so every session and command, runs as in the box (default: the box's user). SWE-agent
    expects root (its tools go to /root): `user="root"` is root inside a box with a user namespace of its own, no
    one outside, and refused in one line where the box has none."""
    swerex_dir: str | None = None
    """A host directory with SWE-ReX installed for the box's Python (`pip install --target DIR …`); default: one
    made once by the host's pip per SWE-ReX version and box Python, under ~/.cache/quinebox/swerex."""
    startup_timeout: float = 60.0
    """The longest the box and its server may take to answer, once SWE-ReX is installed."""
    runtime_timeout: float = 10.0
    """The default timeout of the runtime's `is_alive`."""

    type: Literal["quinebox"] = "quinebox"
    """Discriminator for (de)serialization, as SWE-ReX's own configs have."""

    model_config = ConfigDict(extra="forbid")

    def get_deployment(self) -> QuineboxDeployment:
        return QuineboxDeployment.from_config(self)


def cache_root() -> Path:
    """Where installs of SWE-ReX for boxes' Pythons are kept, this user's own (XDG's cache dir)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "quinebox" / "swerex"


def ensure_install(root: Path, major: int, minor: int, machine: str, glibc: str) -> str:
    """The name of root's subdirectory holding SWE-ReX (the host's version) for that Python, made by pip if missing.

    pip's `--target` with the box's Python version and platform, binary wheels only: the host needs no Python
    like the box's. Made in a temporary directory beside it and renamed into place, under a lock, so a
    concurrent deployment never sees half of it; readable by every uid (a root-made box's user is one of its own).
    Never written by a box: it is granted read-only, and one box's code must not reach another's server."""
    name = f"{PACKAGE_NAME}-{__version__}-cp{major}{minor}-{machine}-glibc{glibc}"
    if (root / name).is_dir():
        return name
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / name).is_dir():
            return name
        libc_minor = int(glibc.split(".")[1])
        platforms = [f"manylinux_2_{m}_{machine}" for m in range(5, libc_minor + 1)] + [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]
        work = Path(tempfile.mkdtemp(prefix=".install-", dir=root))
        try:
            argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", "--target", str(work),
                    "--only-binary=:all:", "--implementation", "cp", "--python-version", f"{major}.{minor}",
                    *(arg for platform in platforms for arg in ("--platform", platform)), f"{PACKAGE_NAME}=={__version__}"]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise QuineboxError(
                    f"installing {PACKAGE_NAME} {__version__} for the box's Python took over {INSTALL_TIMEOUT:.0f} s: check the package index, or give swerex_dir="
                ) from None
            if done.returncode != 0:
                said = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
                raise QuineboxError(
                    f"cannot install {PACKAGE_NAME} {__version__} for the box's Python {major}.{minor} ({machine}): pip said: "
                    f"{said[-1] if said else done.returncode}; give swerex_dir= a directory with it installed for that Python"
                )
            _compile(work, major, minor)
            for top, dirs, files in os.walk(work):
                for entry in (*dirs, *files):
                    path = os.path.join(top, entry)
                    if not os.path.islink(path):
                        os.chmod(path, os.stat(path).st_mode | 0o444 | (0o111 if entry in dirs else 0))
            os.chmod(work, 0o755)
            os.rename(work, root / name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return name


def _compile(work: Path, major: int, minor: int) -> None:
    """Bytecode for the box's Python, made by the host's own interpreter of that version where it has one (the
    server then starts in a third of the time): never by the box's, which an image may have made anything."""
    python = shutil.which(f"python{major}.{minor}")
    if python is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run([python, "-I", "-m", "compileall", "-q", "-j0", str(work)], capture_output=True, timeout=INSTALL_TIMEOUT)


def _drain(stream: Any) -> None:
    while stream.read(65536):
        pass


class QuineboxDeployment(AbstractDeployment):
    """SWE-ReX's `swerex-remote` in a quinebox box; `runtime` is a `RemoteRuntime` that reaches it through a relay.

    Keyword arguments are `QuineboxDeploymentConfig`'s. `sandbox` is the box (a `quinebox.Sandbox`) while started:
    its `exec`, files, `checkpoint` and `fork` are there besides the runtime's."""

    def __init__(self, *, logger: logging.Logger | None = None, **kwargs: Any):
        self._config = QuineboxDeploymentConfig(**kwargs)
        self.logger = logger or get_logger("rex-deploy")
        self._hooks = CombinedDeploymentHook()
        self._sandbox: Sandbox | None = None
        self._server: Any = None
        self._said: deque[bytes] = deque(maxlen=64)  # the server's stderr, its last chunks: why it failed
        self._relay: Relay | None = None
        self._runtime: RemoteRuntime | None = None

    @classmethod
    def from_config(cls, config: QuineboxDeploymentConfig) -> QuineboxDeployment:
        return cls(**config.model_dump(exclude={"type"}))

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise DeploymentNotStartedError()
        return self._sandbox

    @property
    def runtime(self) -> RemoteRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    def _gone(self) -> str | None:
        """Why the runtime cannot answer, if something under it has ended."""
        if self._sandbox is None or self._sandbox.returncode is not None:
            return "the box has ended (its TTL ran out, or it was removed)"
        if self._server is None or self._server.poll() is not None:
            said = b"".join(self._said).decode(errors="replace").strip().splitlines()
            return f"swerex-remote in box {self._sandbox.id} ended" + (f": {said[-1]}" if said else "")
        if self._relay is None or not self._relay.alive():
            said = b"".join(self._relay.said if self._relay else ()).decode(errors="replace").strip().splitlines()
            return f"the relay to box {self._sandbox.id} ended" + (f": {said[-1]}" if said else "")
        return None

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        why = self._gone()
        if why is not None:
            return IsAliveResponse(is_alive=False, message=why)
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Make the box, install SWE-ReX for its Python (once), start swerex-remote and the relay, wait for an answer."""
        if self._sandbox is not None:
            raise RuntimeError("this deployment is started already: stop() it first")
        config = self._config
        began = time.monotonic()
        try:
            await self._start(config)
        except BaseException:
            await self.stop()
            raise
        self.logger.info(f"Runtime started in box {self.sandbox.id} in {time.monotonic() - began:.2f}s")

    async def _start(self, config: QuineboxDeploymentConfig) -> None:
        root = Path(config.swerex_dir).resolve() if config.swerex_dir else cache_root()
        if not config.swerex_dir:
            root.mkdir(parents=True, exist_ok=True)
        where = f"ro:{root}={BOX_DIR}"
        self._hooks.on_custom_step("Starting box")
        self._sandbox = sb = await Sandbox.acreate(
            image=config.image, pull=config.pull, grants=[*config.grants, where], workdir=config.workdir, backend=config.backend,
            runtime=config.runtime, ttl=config.ttl, name=config.name,
        )
        if config.swerex_dir:
            lib = BOX_DIR
        else:
            probe = await sb.aexec([config.python, "-I", "-c", PROBE], timeout=config.startup_timeout)
            fields = probe.stdout.decode(errors="replace").split()
            if probe.returncode != 0 or len(fields) != 6 or fields[0] != "CPython" or fields[4] != "glibc":
                raise QuineboxError(
                    f"the box's {config.python} cannot run swerex-remote: it needs a CPython on glibc "
                    f"(it said {(probe.stdout or probe.stderr).decode(errors='replace').strip()[:200]!r}); give an image that has one, or swerex_dir="
                )
            self._hooks.on_custom_step("Installing SWE-ReX for the box's Python")
            lib = f"{BOX_DIR}/{await asyncio.to_thread(ensure_install, root, int(fields[1]), int(fields[2]), fields[3], fields[5])}"
        token = secrets.token_urlsafe(32)
        self._hooks.on_custom_step("Starting runtime")
        self._server = sb.Popen([config.python, "-I", "-c", SERVER, lib], stdin=f"{token}\n".encode(), stdout=PIPE, stderr=self._said.append, user=config.user)
        try:
            line = await asyncio.wait_for(asyncio.to_thread(self._server.stdout.readline), config.startup_timeout)
        except TimeoutError:
            self._server.kill()
            raise QuineboxError(f"swerex-remote in box {sb.id} did not start in {config.startup_timeout:.0f} s") from None
        if not line.strip().isdigit():
            await asyncio.to_thread(self._server.wait_drained, 10)
            raise QuineboxError(self._gone() or f"swerex-remote in box {sb.id} said {line[:200]!r} instead of its port")
        threading.Thread(target=_drain, args=(self._server.stdout,), daemon=True).start()  # nothing more is said there; a full pipe would stop it
        self._relay = await asyncio.to_thread(Relay, sb, config.python, int(line), timeout=config.startup_timeout)
        self._runtime = RemoteRuntime(host="http://127.0.0.1", port=self._relay.port, auth_token=token, timeout=config.runtime_timeout, logger=self.logger)
        deadline = time.monotonic() + config.startup_timeout
        while not (answer := await self.is_alive(timeout=max(0.1, deadline - time.monotonic()))):
            if self._gone() is not None or time.monotonic() > deadline:
                raise QuineboxError(f"swerex-remote in box {sb.id} does not answer: {answer.message.strip().splitlines()[-1]}")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """End the relay (its port closes) and the box, and everything in it; a second stop does nothing."""
        self._runtime = None
        relay, self._relay = self._relay, None
        sandbox, self._sandbox = self._sandbox, None
        self._server = None
        if relay is not None:
            await asyncio.to_thread(relay.close)
        if sandbox is not None:
            await sandbox.aclose()
