"""A Harbor environment: `harbor run --env quinebox.integrations.harbor:QuineboxEnvironment` runs each trial in a box.

Harbor (Terminal-Bench's harness) gives each trial a container of the task's image, runs the agent's and the
verifier's commands in it, and moves /solution, /tests and /logs in and out. Its Docker provider makes that
container a compose project with the engine's defaults (root, every capability but a few, the engine's seccomp).
This one makes it a quinebox box of the same image instead: the task's Dockerfile is built by the Docker engine
(tagged by the content hash of environment/, so a second trial reuses it), a task that names an image runs that
image, and the box gets a writable root layer of its own (grant `rootfs:rw`, discarded with the box) because a
benchmark's tasks change their container's files; everything else is the hardened box: no capabilities, our
seccomp, never host root, limits. Root inside (Harbor's `user="root"`) is honored where the box has a user
namespace of its own and refused in one line elsewhere.

What maps onto what: Harbor's network policy onto egress grants (`public` → `net`, `no-network` → none, an
allowlist → one `net:HOST` per entry), its cpus, memory and storage onto `cpus:`/`mem:`/`tmp:`, its bind mounts onto `ro:`/`rw:`.
A docker-compose task is refused in one line (capabilities say `docker_compose=False`). `stop(delete=False)` keeps
the box (`quinebox exec --in ID -- bash` looks inside; `quinebox box rm ID` ends it). Only quinebox's public API
is used. See docs/frameworks/harbor.md.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import io
import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from harbor.environments.base import BaseEnvironment, ExecResult, OutputCallback, OutputStream
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import COMPOSE_FILE_NAME, DOCKERFILE_NAME, require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import EnvironmentConfig, NetworkAllowlistEntryType, NetworkMode, NetworkPolicy, classify_network_allowlist_entry
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import EnvironmentPaths, TrialPaths
from pydantic import Field

from quinebox import DEVNULL, QuineboxError, Sandbox, build_image

#: What each box's name starts with: what `quinebox box ls` shows of a Harbor trial's box.
NAME_PREFIX = "harbor-"
#: Each stream of an exec is kept up to this many bytes (Harbor holds them in memory); past it the command is killed.
OUTPUT_MAX = 64 << 20
#: The most a download (one file, or a directory's tar) may hold.
DOWNLOAD_MAX = 1 << 30
#: The longest a copy into the box may take (Harbor's own bound on packing a directory).
TRANSFER_TIMEOUT = 600


class QuineboxOptions(EnvironmentOptions):
    """`--ek KEY=VALUE` options of the quinebox environment (values are parsed as JSON: `--ek grants='["tmp:2g"]'`)."""

    grants: list[str] = Field(default_factory=list, description="Grants each box gets beyond what the task asks (e.g. tmp:2g, pids:512).")
    backend: str | None = Field(default=None, description="Where boxes run: oci or docker (default: quinebox's choice).")
    runtime: str | None = Field(default=None, description="The OCI runtime: runc or runsc (default: quinebox's choice).")
    ttl: str | None = Field(default=None, description="The longest a box may live, kept ones too (e.g. 2h; default: until removed).")
    idle: str | None = Field(default="1h", description="A box with no command running this long ends (null: never; a kept box too).")


def allowlist_grant(entry: str) -> str:
    """One Harbor allowlist entry as an egress grant, any port (Harbor's allowlists name hosts, never ports)."""
    kind = classify_network_allowlist_entry(entry)
    if kind in (NetworkAllowlistEntryType.IPV6_ADDRESS, NetworkAllowlistEntryType.IPV6_CIDR):
        return f"net:[{entry}]:*"
    if kind in (NetworkAllowlistEntryType.IPV4_ADDRESS, NetworkAllowlistEntryType.IPV4_CIDR):
        return f"net:{entry}"
    return f"net:{entry}:*"


def network_grants(policy: NetworkPolicy) -> list[str]:
    """Harbor's network policy as egress grants: a box reaches nothing unless granted."""
    if policy.network_mode == NetworkMode.PUBLIC:
        return ["net"]
    if policy.network_mode == NetworkMode.ALLOWLIST:
        return [allowlist_grant(entry) for entry in policy.allowed_hosts]
    return []


def mount_grant(mount: dict[str, Any]) -> str:
    """A Harbor mount (compose's volume format) as a `ro:`/`rw:` grant; only host directories (binds) can be one."""
    if mount.get("type", "bind") != "bind":
        raise ValueError(f"cannot mount {mount.get('source')!r} at {mount.get('target')!r}: the quinebox environment mounts host paths (type bind) only, not {mount.get('type')!r}")
    kind = "ro" if mount.get("read_only") else "rw"
    return f"{kind}:{os.path.abspath(mount['source'])}={mount['target']}"


def box_name(session_id: str) -> str:
    return NAME_PREFIX + re.sub(r"[^A-Za-z0-9_.-]+", "_", session_id)[:120]


class QuineboxEnvironment(BaseEnvironment):
    """One Harbor trial's environment as one quinebox box of the task's image."""

    options_model = QuineboxOptions
    options: QuineboxOptions
    #: One build of each tag at a time in this process: concurrent trials of one task wait for the first's image.
    _build_locks: ClassVar[dict[str, asyncio.Lock]] = {}

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self._sandbox: Sandbox | None = None
        self._image_user = ""
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, *args, **kwargs)

    @staticmethod
    def type() -> str:
        return "quinebox"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """Not `mounted`: the box's root is an unprivileged id outside, which Harbor's trial dirs would not let write
        (Docker's root writes them as the host's), so /logs is copied out as other remote providers' is."""
        return EnvironmentCapabilities(
            disable_internet=True, network_allowlist=True, network_allowlist_hostnames=True, network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True, network_allowlist_ipv6_addresses=True, network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True, docker_compose=False,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        if (self.environment_dir / COMPOSE_FILE_NAME).exists():
            raise ValueError(
                f"task {self.environment_name!r} is a docker-compose project ({self.environment_dir / COMPOSE_FILE_NAME}): the quinebox "
                "environment runs one box of one image per trial; run this task with --env docker"
            )
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    # -- the box ------------------------------------------------------------------------------

    @property
    def sandbox(self) -> Sandbox:
        """The trial's box, once `start` made it."""
        if self._sandbox is None:
            raise RuntimeError(f"environment {self.session_id} has no box: call start() first")
        return self._sandbox

    def grants(self) -> list[str]:
        """Every grant of the trial's box: its own root layer, the network policy, resources, mounts, the user's."""
        grants = ["rootfs:rw", *network_grants(self.network_policy)]
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        if cpus:
            grants.append(f"cpus:{cpus}")
        memory_mb = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        if memory_mb:
            grants.append(f"mem:{memory_mb}m")
        if self._effective_storage_mb:  # what the box may write: its root layer and /tmp are sized by tmp:
            grants.append(f"tmp:{self._effective_storage_mb}m")
        grants += [mount_grant(dict(mount)) for mount in self._host_mounts]
        return grants + list(self.options.grants)

    async def start(self, force_build: bool) -> None:
        dockerfile = self.environment_dir / DOCKERFILE_NAME
        if self.task_env_config.docker_image and not (force_build and dockerfile.exists()):
            image = self.task_env_config.docker_image
        else:  # the engine builds it once, tagged by its content: the task's next trial finds it built
            lock = self._build_locks.setdefault(str(self.environment_dir), asyncio.Lock())
            async with lock:
                image = await asyncio.to_thread(
                    build_image, dockerfile, self.environment_dir, rebuild=force_build, timeout=float(self.task_env_config.build_timeout_sec),
                )
        self._image_user = await asyncio.to_thread(self._user_of, image)
        self._sandbox = await Sandbox.adetached(
            image=image, grants=self.grants(), name=box_name(self.session_id),
            backend=self.options.backend, runtime=self.options.runtime, ttl=self.options.ttl, idle=self.options.idle,
        )
        self.logger.debug(f"box {self._sandbox.id} of {image} started")
        await self._upload_environment_dir_after_start()
        paths = EnvironmentPaths.for_os(self.os)
        made = await self.ensure_dirs([paths.agent_dir, paths.verifier_dir, paths.artifacts_dir])
        if made is not None and made.return_code != 0:
            raise QuineboxError(f"cannot make Harbor's /logs directories in box {self.sandbox.id}: {made.stderr or made.stdout}")

    def _engine(self) -> Any:
        import docker

        return docker.from_env(timeout=int(self.task_env_config.build_timeout_sec))

    def _user_of(self, image: str) -> str:
        """The image's USER, whom a command that names none runs as (as `docker exec` does); "" where the engine
        does not know the image (quinebox fetches it then, and such a command runs as root)."""
        import docker

        try:
            client = self._engine()
        except docker.errors.DockerException:
            return ""
        try:
            return str((client.images.get(image).attrs.get("Config") or {}).get("User") or "")
        except docker.errors.DockerException:
            return ""
        finally:
            client.close()

    async def stop(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        if delete:
            try:
                await sandbox.adestroy()
            except QuineboxError as exc:  # as Docker's provider, a box that would not go is the trial's warning, not its error
                self.logger.warning(f"box {sandbox.id} of trial {self.session_id}: {exc}")
            return
        await sandbox.aclose()  # detach only: the box lives on for inspection
        self.logger.info(f"kept box {sandbox.id} of trial {self.session_id}: `{Sandbox.connection_command(sandbox.id)}` looks inside, `quinebox box rm {sandbox.id}` ends it")

    async def attach(self) -> None:
        """`harbor trial attach`'s shell: this process becomes `quinebox exec --in ID -it -- bash` (a shell of root's)."""
        os.execvp("quinebox", ["quinebox", "exec", "--in", self.sandbox.id, "-it", "--user", "0", "--", "bash"])

    # -- commands -----------------------------------------------------------------------------

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """`bash -c command` in the box, as Docker's provider runs it; a command past `timeout_sec` is killed (its
        whole process tree, the box stays) and raises, as Docker's does."""
        who = self._resolve_user(user)
        named = str(who) if who is not None else (self._image_user or "root")
        options: dict[str, Any] = {
            "cwd": cwd or self.task_env_config.workdir, "env": self._merge_env(env),
            "user": "0" if named == "root" else named,  # root by its uid: a name costs a read of the box's /etc/passwd
        }
        callback = self._output_callback()
        if callback is None:
            result = await self.sandbox.aexec(["bash", "-c", command], timeout=timeout_sec, max_output=OUTPUT_MAX, **options)
            code, out, err, timed_out = result.returncode, result.stdout, result.stderr, result.timed_out
        else:
            code, out, err, timed_out = await self._streamed(["bash", "-c", command], callback, timeout_sec, options)
        if timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=out.decode(errors="replace") or None, stderr=err.decode(errors="replace") or None, return_code=code)

    async def _streamed(self, argv: list[str], callback: OutputCallback, timeout: int | None, options: dict[str, Any]) -> tuple[int, bytes, bytes, bool]:
        """A command whose output Harbor watches as it comes (a trial's log callbacks): each chunk goes to `callback`
        on this loop, in order, and is kept (up to OUTPUT_MAX a stream) for the result."""
        loop = asyncio.get_running_loop()
        sent: list[concurrent.futures.Future[None]] = []

        def sink(kept: bytearray, stream: OutputStream) -> Callable[[bytes], None]:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

            def take(chunk: bytes) -> None:
                kept.extend(chunk[: max(OUTPUT_MAX - len(kept), 0)])
                if text := decoder.decode(chunk):
                    sent.append(asyncio.run_coroutine_threadsafe(callback(text, stream), loop))

            return take

        out, err = bytearray(), bytearray()
        proc = await asyncio.to_thread(self.sandbox.Popen, argv, stdin=DEVNULL, stdout=sink(out, "stdout"), stderr=sink(err, "stderr"), **options)
        code = await asyncio.to_thread(proc.wait_drained, timeout)
        for future in sent:
            await asyncio.wrap_future(future)
        return code, bytes(out), bytes(err), bool(proc.timed_out)

    # -- files --------------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """One host file into the box at `target_path`, its mode kept (a script stays executable)."""
        parent, _, name = target_path.rstrip("/").rpartition("/")
        await self._untar(await asyncio.to_thread(tar_of, Path(source_path), name), parent or "/")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """What is in `source_dir` into `target_dir` of the box (made if missing), over what is there."""
        await self._untar(await asyncio.to_thread(tar_of, Path(source_dir), None), target_dir)

    async def _untar(self, data: bytes, target_dir: str) -> None:
        """A tar unpacked into `target_dir` (made if missing) by the box's root, owned by root, as Docker's provider
        copies files in: Harbor puts /solution and /tests at the top of the tree and into directories the image's
        root made. Unpacked in the box, bounded and refusing any member that would leave `target_dir` (put_tar)."""
        await self.sandbox.aput_tar(target_dir, io.BytesIO(data), user="0", timeout=TRANSFER_TIMEOUT)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.sandbox.aread_file(source_path, max_bytes=DOWNLOAD_MAX)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(target.write_bytes, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self.sandbox.aget_dir(source_dir, str(target_dir), max_bytes=DOWNLOAD_MAX)


def tar_of(source: Path, name: str | None) -> bytes:
    """A tar of one file named `name`, or (`name` None) of what directory `source` holds, by their paths in it;
    every member owned by root, as Docker's provider sends them."""

    def rooted(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if name is not None:
            tar.add(str(source), arcname=name, recursive=False, filter=rooted)
        else:
            for path in sorted(source.rglob("*")):
                tar.add(str(path), arcname=path.relative_to(source).as_posix(), recursive=False, filter=rooted)
    return buffer.getvalue()
