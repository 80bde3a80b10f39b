"""The OpenAI Agents SDK's sandbox on quinebox: `QuineboxSandboxClient` and its `QuineboxSandboxClientOptions`.

    from agents import RunConfig, Runner
    from agents.sandbox import SandboxAgent, SandboxRunConfig
    from quinebox.integrations.openai_agents import QuineboxSandboxClient, QuineboxSandboxClientOptions

    sandbox = SandboxRunConfig(client=QuineboxSandboxClient(), options=QuineboxSandboxClientOptions())
    result = await Runner.run(SandboxAgent(name="dev", model=...), "...", run_config=RunConfig(sandbox=sandbox))

The SDK's interface (agents.sandbox: BaseSandboxClient, BaseSandboxSession) over quinebox's public API only. A
session is a long-lived box made by `Sandbox.detached`, which outlives this process as a Docker container outlives
the Python that made it; the workspace is the box's /world (the SDK's default root, /workspace, is mapped onto it,
as its local provider maps it onto a directory of its own); execs, reads and writes are the box's; the workspace
persisted and hydrated is a tar stream of it (`get_tar`/`put_tar`). `resume` reattaches to the box while it lives
(`Sandbox.connect`), else restores it from its newest checkpoint where the runtime can take one (gVisor: memory,
processes and files at one instant), else makes a new box that the SDK hydrates from the persisted workspace.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from agents.sandbox import Manifest
from agents.sandbox.errors import ExecTimeoutError, ExecTransportError, WorkspaceArchiveReadError, WorkspaceArchiveWriteError, WorkspaceReadNotFoundError
from agents.sandbox.materialization import MaterializationResult
from agents.sandbox.session import BaseSandboxClient, BaseSandboxClientOptions, BaseSandboxSession, Dependencies, Instrumentation, SandboxSession, SandboxSessionState
from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.blocking_io import run_blocking_workspace_io
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, should_skip_tar_member, validate_tarfile
from pydantic import Field

from quinebox import QuineboxError, Sandbox
from quinebox.integrations.openai_agents_pty import PtySessions, Running

#: The SDK's default workspace root, which a box has nowhere writable: a session's workspace is the box's world.
SDK_ROOT = "/workspace"
WORLD = "/world"
#: Workspace tars bigger than this are spilled from memory to a temporary file while they pass through.
SPOOL = 16 * 1024 * 1024


class QuineboxSandboxClientOptions(BaseSandboxClientOptions):
    """The box a session gets, as `quinebox box create` takes it; every default is the CLI's.

    `grants` are quinebox grant strings ("mem:1g", "net:pypi.org", "rw:/data=/data", ...); `idle`: how long the box
    lasts with no exec running (None: until deleted or its `ttl`); `max_output`: what an exec keeps of each of stdout
    and stderr (default: the box's, 64 MiB); `checkpoint`: whether a persisted workspace is also a checkpoint of the
    live box where its runtime can take one (gVisor)."""

    type: Literal["quinebox"] = "quinebox"
    image: str | None = None
    grants: tuple[str, ...] = ()
    policy: str | None = None
    pull: str = "missing"
    backend: str | None = None
    runtime: str | None = None
    ttl: float | str | None = None
    idle: float | str | None = "1h"
    max_output: int | None = None
    checkpoint: bool = True

    def box_options(self, manifest: Manifest) -> dict[str, Any]:
        """`Sandbox.detached`'s keyword arguments: these options, and the manifest's host paths as grants."""
        paths = [f"{'ro' if grant.read_only else 'rw'}:{grant.host_path}={grant.path}" for grant in manifest.extra_path_grants if grant.host_path]
        return {
            "image": self.image, "grants": [*self.grants, *paths], "policy": self.policy, "pull": self.pull,
            "backend": self.backend, "runtime": self.runtime, "ttl": self.ttl, "idle": self.idle,
        }


class QuineboxSandboxSessionState(SandboxSessionState):
    """What a session is resumed from: the SDK's state, the box's id and options, and its newest checkpoint."""

    type: Literal["quinebox"] = "quinebox"
    box_id: str = ""
    options: QuineboxSandboxClientOptions = Field(default_factory=QuineboxSandboxClientOptions)
    checkpoint_id: str | None = None

    def _sanitize_persisted_provider_identity(self, data: dict[str, Any], *, mount_authority_redacted: bool) -> None:
        # As the SDK's Docker state does: a state whose mount credentials were redacted must not reattach the box.
        if mount_authority_redacted:
            data["box_id"] = ""
            data["checkpoint_id"] = None
            data["workspace_root_ready"] = False


class QuineboxSandboxSession(PtySessions, BaseSandboxSession):
    """One box as the SDK's session: its execs, files and workspace tar streams."""

    state: QuineboxSandboxSessionState

    def __init__(self, state: QuineboxSandboxSessionState, box: Sandbox | None) -> None:
        self.state = state
        self._box = box
        self._environment: dict[str, str] | None = None
        self._checkpoints = state.options.checkpoint  # off for good once the runtime refuses one
        self._running: dict[int, Running] = {}

    # -- the box ---------------------------------------------------------------------------------

    def _live_box(self) -> Sandbox:
        if self._box is None:
            raise ExecTransportError(command=("quinebox",), message=f"the session's box {self.state.box_id} is detached: start the session again")
        return self._box

    async def _ensure_backend_started(self) -> None:
        """After `shutdown` (which only detaches) the same box is attached again, or, gone, replaced."""
        if self._box is None:
            self._box, preserved = await open_box(self.state)
            self._set_start_state_preserved(preserved)

    async def running(self) -> bool:
        return self._box is not None and self._box.returncode is None

    async def _shutdown_backend(self) -> None:
        """Detach: the box lives on (until `client.delete`, its TTL, or its idle time), as a stopped Docker
        container stays, so `resume` can reattach it."""
        box, self._box = self._box, None
        if box is not None:
            await box.aclose()

    # -- execs -----------------------------------------------------------------------------------

    async def exec(self, *command: str | Path, timeout: float | None = None, shell: bool | list[str] = True,
                   user: str | User | None = None) -> ExecResult:
        """The box's exec takes the user itself (no sudo in the box): the command is run as `user`, or refused."""
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        return await self._run(argv, timeout=timeout, user=user.name if isinstance(user, User) else user)

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        return await self._run([str(part) for part in command], timeout=timeout, user=None)

    async def _exec_context(self) -> tuple[dict[str, str], str | None]:
        """Every exec's environment (the manifest's) and working directory: the workspace root once the manifest's
        first application made it, the box's workdir until then."""
        if self._environment is None:
            self._environment = await self.state.manifest.environment.resolve()
        return self._environment, self.state.manifest.root if self.state.workspace_root_ready else None

    async def _run(self, argv: list[str], *, timeout: float | None, user: str | None, input: bytes | None = None) -> ExecResult:
        box = self._live_box()
        env, cwd = await self._exec_context()
        options: dict[str, Any] = {}
        if self.state.options.max_output is not None:
            options["max_output"] = self.state.options.max_output
        try:
            done = await box.aexec(argv, input=input, cwd=cwd, env=env, user=user, timeout=timeout, **options)
        except QuineboxError as exc:
            raise ExecTransportError(command=argv, message=str(exc), cause=exc) from exc
        if done.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(stdout=done.stdout, stderr=done.stderr, exit_code=done.returncode)

    async def _apply_manifest(self, *, only_ephemeral: bool = False, provision_accounts: bool = True) -> MaterializationResult:
        if provision_accounts and not only_ephemeral:
            await self.provision_manifest_accounts()
        return await super()._apply_manifest(only_ephemeral=only_ephemeral, provision_accounts=False)

    async def provision_manifest_accounts(self) -> None:
        """A box cannot add accounts (its root is the image's, and no one in it is root outside it): the manifest's
        users and groups must be the image's own. Each is looked up there, and a missing one refused in one line."""
        manifest = self.state.manifest
        wanted = {"passwd": {u.name for u in manifest.users} | {u.name for g in manifest.groups for u in g.users}, "group": {g.name for g in manifest.groups}}
        for table, names in wanted.items():
            if not names:
                continue
            known = {line.split(":", 1)[0] for line in (await self._live_box().aread_file(f"/etc/{table}")).decode(errors="replace").splitlines()}
            for name in sorted(names - known):
                kind = "user" if table == "passwd" else "group"
                raise ValueError(f"{kind} {name!r} is not in the box's image (/etc/{table}), and a quinebox box cannot add one: use an image that has it")

    # -- files -----------------------------------------------------------------------------------

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        return self.state.box_id

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        """As the SDK's Docker provider: a path is resolved in the box, links and all, and must stay in the workspace."""
        return await self._validate_remote_path_access(path, for_write=for_write)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        where = await self._validate_path_access(path)
        if user is not None:
            done = await self.exec("cat", "--", str(where), shell=False, user=user)
            if not done.ok():
                await self._raise_read_error_from_exec(path=path, workspace_path=where, command=("cat", "--", str(where)), result=done, user=user)
            return io.BytesIO(done.stdout)
        try:
            return io.BytesIO(await self._live_box().aread_file(str(where)))
        except FileNotFoundError as exc:
            raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
        except (OSError, QuineboxError) as exc:
            raise WorkspaceArchiveReadError(path=path, cause=exc) from exc

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        """A prefix of at most `max_bytes`, read in the box (`head -c`), as the SDK's Docker provider reads it."""
        where = await self._validate_path_access(path)
        script = '[ -e "$1" ] || exit 44; [ -f "$1" ] || exit 45; head -c "$2" < "$1"'
        done = await self.exec("/bin/sh", "-c", script, "sh", str(where), str(max_bytes), shell=False, timeout=30.0)
        if done.exit_code == 44:
            raise WorkspaceReadNotFoundError(path=path)
        if not done.ok():
            raise WorkspaceArchiveReadError(path=path)
        return done.stdout

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        payload = coerce_write_payload(path=path, data=data)
        where = await self._validate_path_access(path, for_write=True)
        content = await run_blocking_workspace_io(payload.stream.read)
        if user is not None:
            script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
            name = user.name if isinstance(user, User) else user
            done = await self._run(["sh", "-c", script, "sh", str(where)], timeout=None, user=name, input=content)
            if not done.ok():
                raise WorkspaceArchiveWriteError(path=where, context={"stderr": done.stderr.decode(errors="replace")})
            return
        try:
            await self._live_box().awrite_file(str(where), content)
        except (OSError, QuineboxError) as exc:
            raise WorkspaceArchiveWriteError(path=where, cause=exc) from exc

    # -- the workspace as a tar stream -------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar stream of workspace-relative members, less what the SDK keeps out of it (ephemeral
        manifest entries) and FIFOs and devices (which no extractor restores)."""
        root = self.state.manifest.root
        raw = tempfile.SpooledTemporaryFile(max_size=SPOOL)
        try:
            await self._live_box().aget_tar(root, raw)
        except (OSError, QuineboxError) as exc:
            raw.close()
            raise WorkspaceArchiveReadError(path=Path(root), cause=exc) from exc
        skip = self._persist_workspace_skip_relpaths()
        try:
            return await run_blocking_workspace_io(_portable, raw, skip)
        except (OSError, tarfile.TarError) as exc:
            raise WorkspaceArchiveReadError(path=Path(root), cause=exc) from exc
        finally:
            raw.close()

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """A tar stream of `persist_workspace`'s (or any workspace tar) into the workspace, checked first as the SDK
        checks one (no member out of the workspace, no link that leads out of it)."""
        root = self.state.manifest.root
        archive = tempfile.SpooledTemporaryFile(max_size=SPOOL)
        try:
            await run_blocking_workspace_io(_checked_copy, data, archive)
        except UnsafeTarMemberError as exc:
            archive.close()
            raise WorkspaceArchiveWriteError(path=Path(root), context={"reason": exc.reason, "member": exc.member}, cause=exc) from exc
        except (OSError, tarfile.TarError) as exc:
            archive.close()
            raise WorkspaceArchiveWriteError(path=Path(root), cause=exc) from exc
        try:
            box = self._live_box()
            await box.amkdir(root)
            await box.aput_tar(root, archive)
        except (OSError, QuineboxError) as exc:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=exc) from exc
        finally:
            archive.close()

    async def _persist_snapshot(self) -> None:
        """The SDK's snapshot (the workspace tar), then, where the runtime can take one, a checkpoint of the whole
        live box: what `resume` restores first once the box is gone. A runtime that cannot is asked once."""
        await super()._persist_snapshot()
        if not self._checkpoints or self._box is None:
            return
        try:
            made = await self._box.acheckpoint()
        except QuineboxError:
            self._checkpoints = False
            return
        self.state.checkpoint_id = made.id


def _portable(raw: Any, skip: set[Path]) -> io.IOBase:
    """`get_tar`'s archive of the root, its members renamed relative to it and filtered (see persist_workspace)."""
    raw.seek(0)
    out = tempfile.TemporaryFile()
    with tarfile.open(fileobj=raw, mode="r|*") as source, tarfile.open(fileobj=out, mode="w") as sink:
        for member in source:
            name = _relative(member.name)
            if name is None or member.isfifo() or member.ischr() or member.isblk() or member.isdev():
                continue
            if name != "." and should_skip_tar_member(name, skip_rel_paths=skip, root_name=None):
                continue
            member.name = name
            sink.addfile(member, source.extractfile(member) if member.isreg() else None)
    out.seek(0)
    return out


def _relative(name: str) -> str | None:
    """A member's name relative to the workspace root ("." for the root itself); None for a name that leaves it."""
    parts = [part for part in PurePosixPath(name).parts if part not in ("", ".", "/")]
    if ".." in parts:
        return None
    return "/".join(["."] + parts) if parts else "."


def _checked_copy(data: io.IOBase, archive: Any) -> None:
    while chunk := data.read(io.DEFAULT_BUFFER_SIZE):
        archive.write(chunk.encode() if isinstance(chunk, str) else chunk)
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        validate_tarfile(tar, allow_external_symlink_targets=False)
    archive.seek(0)


async def open_box(state: QuineboxSandboxSessionState) -> tuple[Sandbox, bool]:
    """The session's box and whether its workspace is the one persisted (so the SDK need not hydrate it): the box
    itself while it lives, else a restore of its newest checkpoint, else a new box (the SDK hydrates it)."""
    if state.box_id:
        try:
            return await Sandbox.aconnect(state.box_id), True
        except QuineboxError:
            pass  # gone: its TTL, its idle time, `quinebox box rm`, a reboot
    options = state.options.box_options(state.manifest)
    if state.checkpoint_id:
        try:  # a copy of the checkpoint's box, held as `detached` holds one: it outlives this process too
            box = await Sandbox.adetached(snapshot=state.checkpoint_id, ttl=options["ttl"], idle=options["idle"])
        except QuineboxError:
            state.checkpoint_id = None  # removed (`quinebox box snapshots rm`), or not this user's
        else:
            state.box_id = box.id
            return box, True
    box = await Sandbox.adetached(**options)
    state.box_id = box.id
    state.workspace_root_ready = False
    return box, False


class QuineboxSandboxClient(BaseSandboxClient[QuineboxSandboxClientOptions | None]):
    """Sessions in quinebox boxes: `create`, `resume`, `delete`, and the state they are resumed from."""

    backend_id = "quinebox"
    supports_default_options = True

    def __init__(self, *, instrumentation: Instrumentation | None = None, dependencies: Dependencies | None = None) -> None:
        super().__init__()
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()
        self._dependencies = dependencies

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None, manifest: Manifest | None = None,
                     options: QuineboxSandboxClientOptions | None = None) -> SandboxSession:
        options = options if options is not None else QuineboxSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        if manifest.root == SDK_ROOT:
            manifest = manifest.model_copy(update={"root": WORLD}, deep=True)
        self._validate_manifest_for_create(manifest)
        box = await Sandbox.adetached(**options.box_options(manifest))
        session_id = uuid.uuid4()
        state = QuineboxSandboxSessionState(
            session_id=session_id, manifest=manifest, snapshot=resolve_snapshot(snapshot, str(session_id)),
            box_id=box.id, options=options,
        )
        return self._wrap_session(QuineboxSandboxSession(state, box), instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """End the session's box (its checkpoints stay: `quinebox box snapshots rm` removes them)."""
        inner = session._inner
        if not isinstance(inner, QuineboxSandboxSession):
            raise TypeError("QuineboxSandboxClient.delete expects a session of QuineboxSandboxClient's")
        box, inner._box = inner._box, None
        if box is None:
            try:
                box = await Sandbox.aconnect(inner.state.box_id)
            except QuineboxError:
                return session  # gone already
        await box.adestroy()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, QuineboxSandboxSessionState):
            raise TypeError("QuineboxSandboxClient.resume expects a QuineboxSandboxSessionState")
        state.assert_path_grants_rebound()
        box, preserved = await open_box(state)
        inner = QuineboxSandboxSession(state, box)
        inner._set_start_state_preserved(preserved)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, QuineboxSandboxSessionState)
