"""deepagents' sandbox backend on a quinebox box: `QuineboxSandbox`, and `QuineboxProvider` for deepagents-code.

deepagents (LangChain's agent harness) gives an agent `execute`, `ls`, `read_file`, `write_file`, `edit_file`,
`glob` and `grep` over a `BaseSandbox`, which asks its subclass for three things only: run a shell command
(`execute`), put files in (`upload_files`) and take them out (`download_files`); every other tool is a small
Python script `BaseSandbox` runs through `execute`. `QuineboxSandbox` is that subclass over the public
`quinebox.Sandbox`: the same hardened box as `quinebox exec` (no root outside, no network unless granted, limits,
audit), its grants fixed when it is made, each command an exec of its own in it.

deepagents-code (the `dcode` CLI) finds third-party sandboxes through the `deepagents_code.sandbox_providers`
entry point and calls `get_or_create(sandbox_id=..., **params)` / `delete(sandbox_id=...)` on the class it names;
`QuineboxProvider` is that class. It makes detached boxes (they outlive the CLI's process, as a cloud sandbox
does), reattaches to a living one by id, and restores a snapshot's box (`--sandbox-snapshot-name`). The
deepagents library itself reads no entry point: a program passes `backend=QuineboxSandbox(...)` to
`create_deep_agent`. See docs/frameworks/deepagents.md.

Errors are deepagents' data, chosen by the exception's type: a file's FileNotFoundError is `file_not_found`,
PermissionError `permission_denied`, IsADirectoryError `is_directory`, a relative path, NotADirectoryError or
FileExistsError `invalid_path` (as deepagents' own FilesystemBackend maps them); any other OSError of one file
(a FIFO planted where a file was, a file past the cap, a stalled read) is that file's one line, the others go on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from deepagents.backends.protocol import FILE_NOT_FOUND, INVALID_PATH, IS_DIRECTORY, PERMISSION_DENIED, ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from quinebox import ExecResult, Sandbox

#: A command's default limit, as LangSmith's sandbox has it: agents run installs and test suites.
DEFAULT_TIMEOUT = 30 * 60
#: The most of a command's output kept (its first bytes): BaseSandbox's read, grep and glob come back through
#: `execute`, and read's own cap (500 KiB, base64 for a binary file) lies well under it.
MAX_OUTPUT = 4 << 20
#: A file's download cap: the bytes are held whole in memory, twice (the box's read, the response).
MAX_DOWNLOAD = 256 << 20
#: What a provider's `get_or_create` passes on to `Sandbox.detached`: deepagents-code's config `params`.
BOX_OPTIONS = frozenset({"image", "grants", "policy", "workdir", "pull", "backend", "runtime", "ttl", "idle", "name"})
#: ... or to `Sandbox.restore`, for deepagents-code's `--sandbox-snapshot-name`: a snapshot's box has its grants.
RESTORE_OPTIONS = frozenset({"snapshot", "ttl", "name"})
#: ... and to the QuineboxSandbox over it.
BACKEND_OPTIONS = frozenset({"timeout", "max_output", "max_download"})


class QuineboxSandbox(BaseSandbox):
    """A deepagents backend whose every command and file is in one quinebox box.

    `QuineboxSandbox(image=..., grants=[...], ...)` makes a box with `quinebox.Sandbox`'s options and removes it
    on `close()` (or at the end of a `with` block); `QuineboxSandbox(sandbox=sb)` runs in a box the caller made
    and leaves it to them. `timeout`: a command's limit in seconds when the agent names none (0: none);
    `max_output`: the bytes of a command's output kept.
    """

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        *,
        timeout: int = DEFAULT_TIMEOUT,
        max_output: int = MAX_OUTPUT,
        max_download: int = MAX_DOWNLOAD,
        **options: Any,
    ):
        if sandbox is not None and options:
            raise TypeError(f"QuineboxSandbox got a sandbox and box options ({', '.join(sorted(options))}): give one")
        if timeout < 0:
            raise ValueError(f"timeout must be 0 (none) or a number of seconds, got {timeout}")
        self._owned = sandbox is None
        self.sandbox: Sandbox = Sandbox(**options) if sandbox is None else sandbox
        self._timeout = timeout
        self._max_output = max_output
        self._max_download = max_download

    @property
    def id(self) -> str:
        """The box's id: what `quinebox box ls` shows and `quinebox exec --in` takes."""
        return self.sandbox.id

    # -- commands ------------------------------------------------------------------------------

    def _argv(self, command: str) -> list[str]:
        # deepagents asks for one stream, stdout and stderr as a terminal shows them: the shell sends its stderr
        # to its stdout before the command runs (on the command's own first line, so an error's line is its own).
        return ["sh", "-c", "exec 2>&1; " + command]

    def _limit(self, timeout: int | None) -> float | None:
        chosen = self._timeout if timeout is None else timeout
        if chosen < 0:
            raise ValueError(f"timeout must be 0 (none) or a number of seconds, got {chosen}")
        return chosen or None

    def _response(self, done: ExecResult, limit: float | None) -> ExecuteResponse:
        output = done.stdout.decode(errors="replace")
        if done.timed_out:
            output += f"\n[Command timed out after {limit:g} seconds: its processes were killed; the box stays up]"
        return ExecuteResponse(output=output, exit_code=done.returncode, truncated=done.truncated)

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run `command` with `sh -c` in the box's working directory; a timeout kills it (exit 124), not the box."""
        limit = self._limit(timeout)
        return self._response(self.sandbox.exec(self._argv(command), timeout=limit, max_output=self._max_output), limit)

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        limit = self._limit(timeout)
        return self._response(await self.sandbox.aexec(self._argv(command), timeout=limit, max_output=self._max_output), limit)

    # -- files ---------------------------------------------------------------------------------

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Each file written whole, its missing parent directories made; one response per file, in order."""
        responses = []
        for path, content in files:
            error = _invalid(path)
            if error is None:
                try:
                    self.sandbox.write_file(path, content)
                except OSError as exc:
                    error = _error_of(exc)
            responses.append(FileUploadResponse(path=path, error=error))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Each file's bytes (up to `max_download`); one response per path, in order."""
        responses = []
        for path in paths:
            error, content = _invalid(path), None
            if error is None:
                try:
                    content = self.sandbox.read_file(path, max_bytes=self._max_download)
                except OSError as exc:
                    error = _error_of(exc)
            responses.append(FileDownloadResponse(path=path, content=content, error=error))
        return responses

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            error = _invalid(path)
            if error is None:
                try:
                    await self.sandbox.awrite_file(path, content)
                except OSError as exc:
                    error = _error_of(exc)
            responses.append(FileUploadResponse(path=path, error=error))
        return responses

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            error, content = _invalid(path), None
            if error is None:
                try:
                    content = await self.sandbox.aread_file(path, max_bytes=self._max_download)
                except OSError as exc:
                    error = _error_of(exc)
            responses.append(FileDownloadResponse(path=path, content=content, error=error))
        return responses

    # -- the box's end -------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the box if this backend made it; a box the caller gave stays theirs. A second close does nothing."""
        if self._owned:
            self.sandbox.close()

    async def aclose(self) -> None:
        if self._owned:
            await self.sandbox.aclose()

    def __enter__(self) -> QuineboxSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _invalid(path: str) -> str | None:
    """deepagents names files by absolute path; anything else is refused before the box is asked."""
    return None if path.startswith("/") and "\0" not in path else INVALID_PATH


def _error_of(exc: OSError) -> str:
    """A file's error as deepagents' code for its type, or (none fits) its one line."""
    if isinstance(exc, FileNotFoundError):
        return FILE_NOT_FOUND
    if isinstance(exc, PermissionError):
        return PERMISSION_DENIED
    if isinstance(exc, IsADirectoryError):
        return IS_DIRECTORY
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return INVALID_PATH
    return str(exc)


class QuineboxProvider:
    """deepagents-code's sandbox provider (`dcode --sandbox quinebox`): detached boxes, found again by id.

    deepagents-code loads it from the `deepagents_code.sandbox_providers` entry point and calls it as its
    `SandboxProvider` ABC says; it is not a subclass of that ABC, so the deepagents library alone (without the
    CLI's package) can use it too.
    """

    @property
    def metadata(self) -> Any:
        """What deepagents-code shows of the provider, in its own type (None where that package is not installed)."""
        try:
            # deepagents-code is the CLI's package, never a dependency: installed in neither venv mypy or the tests use.
            from deepagents_code.integrations.sandbox_provider import SandboxInstallHint, SandboxProviderMetadata  # type: ignore[import-not-found]
        except ImportError:
            return None
        return SandboxProviderMetadata(
            name="quinebox", working_dir="/world", install=SandboxInstallHint(kind="package", name="quinebox[deepagents]"),
            supports_sandbox_id=True, supports_snapshot_name=True, backend_module="quinebox.integrations.deepagents",
        )

    def get_or_create(self, *, sandbox_id: str | None = None, **params: Any) -> QuineboxSandbox:
        """The living box `sandbox_id` (an id or a name of this user's); else a new box from `snapshot` (a quinebox
        snapshot's id: `Sandbox.restore`, owned by this process); else a new detached box made with `params`:
        `Sandbox`'s options (deepagents-code's config `params`). `timeout`, `max_output` and `max_download` are
        the backend's."""
        box, backend = _options(sandbox_id, params)
        if sandbox_id is not None:
            return QuineboxSandbox(Sandbox.connect(sandbox_id), **backend)
        if "snapshot" in box:
            return QuineboxSandbox(Sandbox.restore(box.pop("snapshot"), **box), **backend)
        return QuineboxSandbox(Sandbox.detached(**box), **backend)

    def delete(self, *, sandbox_id: str, **params: Any) -> None:
        """End the box `sandbox_id` and remove it."""
        _refuse(params, allowed=())
        Sandbox.connect(sandbox_id).destroy()

    async def aget_or_create(self, *, sandbox_id: str | None = None, **params: Any) -> QuineboxSandbox:
        box, backend = _options(sandbox_id, params)
        if sandbox_id is not None:
            return QuineboxSandbox(await Sandbox.aconnect(sandbox_id), **backend)
        if "snapshot" in box:
            return QuineboxSandbox(await Sandbox.arestore(box.pop("snapshot"), **box), **backend)
        return QuineboxSandbox(await Sandbox.adetached(**box), **backend)

    async def adelete(self, *, sandbox_id: str, **params: Any) -> None:
        _refuse(params, allowed=())
        await (await Sandbox.aconnect(sandbox_id)).adestroy()


def _options(sandbox_id: str | None, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`get_or_create`'s params as the box's options and the backend's; a box's options for a box made already,
    or an option of neither, is refused (TypeError, as deepagents-code's own providers refuse them)."""
    backend = {key: params[key] for key in BACKEND_OPTIONS.intersection(params)}
    box = {key: value for key, value in params.items() if key not in backend}
    _refuse(box, allowed=() if sandbox_id is not None else RESTORE_OPTIONS if "snapshot" in box else BOX_OPTIONS)
    return box, backend


def _refuse(params: dict[str, Any], allowed: Iterable[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        takes = ", ".join(sorted(allowed)) or "nothing more here"
        raise TypeError(f"quinebox's deepagents provider was given {', '.join(unknown)}: it takes {takes}")
