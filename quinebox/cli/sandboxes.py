"""Commands for long-lived boxes: `box create`, `box ls`, `box rm`, and `cp` to and from one.

`exec --in ID` (box.py) runs a command in one. `box create` leaves a holder process of its own owning the box
(box/live/holders.py, as `quinebox.Sandbox.detached` does), so the box outlives the command that made it: it lasts
until `box rm`, its --ttl, or --idle with no exec running, and it goes when its holder does, however that ends.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import typer

from quinebox.cli.app import BACKEND_HELP, PULL_HELP, RUNTIME_HELP, WORLD_FROM_HELP, WORLD_HELP, WORLD_TAR_HELP, app, backend_metavar, check_backend, fail, reported, say

if TYPE_CHECKING:
    from quinebox.box.live.box_files import Via
    from quinebox.box.live.sandboxes import Record

box_app = typer.Typer(no_args_is_help=True, help="Long-lived boxes: made once, any number of commands run in them (`quinebox exec --in ID`).")
app.add_typer(box_app, name="box")

#: How long a `box create` box lasts with no exec running in it, unless --idle says otherwise.
DEFAULT_IDLE = "1h"


@box_app.command("create", help="Make a box that lasts; print its id. Commands run in it with `quinebox exec --in ID -- CMD`.")
def box_create_command(
    grant: list[str] = typer.Option([], "-g", "--grant", metavar="SPEC", help="A grant, as for exec: fixed for the box's life."),
    image: str | None = typer.Option(None, "--image", help="Any image (default: the agent image)."),
    pull: str = typer.Option("missing", "--pull", metavar="missing|always|never", help=PULL_HELP),
    workdir: str | None = typer.Option(None, "-w", "--workdir", help="Each command's default working directory."),
    env: list[str] = typer.Option([], "-e", "--env", metavar="NAME[=VALUE]", help="A variable every command gets; same as -g env:…"),
    policy: str | None = typer.Option(None, "--policy", metavar="FILE.yaml|PRESET", help="Grants from a policy file or preset."),
    world: str | None = typer.Option(None, "--world", metavar="DIR", help=WORLD_HELP),
    world_from: list[str] = typer.Option([], "--world-from", metavar="empty|PATH", help=WORLD_FROM_HELP),
    world_tar: str | None = typer.Option(None, "--world-tar", metavar="FILE", help=WORLD_TAR_HELP),
    name: str | None = typer.Option(None, "--name", help="A name `exec --in`, `cp` and `box rm` take instead of the id."),
    ttl: str | None = typer.Option(None, "--ttl", metavar="DURATION", help="Remove the box this long after it is made (30m, 2h)."),
    idle: str = typer.Option(DEFAULT_IDLE, "--idle", metavar="DURATION", help="Remove it after this long with no command run in it (0: never)."),
    backend: str | None = typer.Option(None, "--backend", metavar=backend_metavar(), help=BACKEND_HELP),
    runtime: str | None = typer.Option(None, "--runtime", metavar="runc|crun|runsc|PATH", help=RUNTIME_HELP),
) -> None:
    from quinebox.box.options import BoxOptions
    from quinebox.errors import GrantError
    from quinebox.grants import parse_duration

    check_backend(backend)
    if name is not None and (not name or name[0] in "-." or any(c in name for c in "/: \0")):
        say(f"bad --name {name!r}: use letters, digits, '-', '_' and '.', not starting with '-' or '.'")
        raise typer.Exit(2)
    with reported():
        idle_s = parse_duration(idle) if idle not in ("0", "") else None
        if ttl is not None and parse_duration(ttl) <= 0:
            raise GrantError(f"bad --ttl {ttl!r}: give a duration, as in --ttl 30m")
    box = BoxOptions.of(
        grants=(*grant, *(f"env:{e}" for e in env)), image=image, pull=pull, workdir=workdir, policy=policy, world=world,
        world_from=tuple(world_from) or None, world_tar=world_tar, backend=backend, runtime=runtime,
    )  # --backend and --runtime reach the holder in the box's options, never through this process's environment
    raise typer.Exit(hold({"options": box, "ttl": ttl, "name": name}, idle_s))


def hold(options: dict[str, Any], idle: float | None) -> int:
    """Fork the holder, which makes the box and owns it; print the id it reports, or its one line of failure."""
    return told(*holding(options, idle))


def holding(options: dict[str, Any], idle: float | None) -> tuple[int, int]:
    """A holder forked (its pid; box/live/holders.py), making the box `options` say (Sandbox's keyword arguments, or
    `snapshot` and its own for a copy of a snapshot's box: sandbox.held); what it reports comes on the returned fd."""
    import functools

    from quinebox.box.live import holders
    from quinebox.sandbox import held

    return holders.fork(functools.partial(held, options, idle), idle)


def told(pid: int, read_end: int) -> int:
    """Print the id the holder reports, or say its one line of failure (its exit status then)."""
    from quinebox.box.live import holders
    from quinebox.errors import QuineboxError

    try:
        print(holders.told(read_end, pid), flush=True)
    except QuineboxError as exc:
        return fail(exc).exit_code
    return 0


@box_app.command("ls", help="List long-lived boxes: id, name, where they run, age, and who owns them.")
def box_ls_command() -> None:
    import time

    from quinebox.box.live import freezing, sandboxes

    with reported():
        rows = sandboxes.live()
    print(f"{'ID':12}  {'NAME':16}  {'BACKEND':7}  {'STATE':7}  {'AGE':>6}  {'TTL':>6}  {'IDLE':>6}  OWNER")
    for record, _box in rows:
        owner = record.owner.split(":")[1]
        age = time.time() - record.created
        state = "paused" if freezing.pause_of(record.session) is not None else "running"
        print(
            f"{record.session:12}  {record.name or '-':16}  {record.backend:7}  {state:7}  {_duration(age):>6}  {_duration(record.ttl):>6}  "
            f"{_duration(record.idle):>6}  {'holder ' if record.holder else 'process '}{owner}"
        )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


@box_app.command("rm", help="Remove long-lived boxes and everything running in them.")
def box_rm_command(refs: list[str] = typer.Argument(..., metavar="ID|NAME...")) -> None:
    """Each box ended as `Sandbox.destroy` ends an attached one: by its owner, the one way every box is removed;
    only an owner that cannot be asked, or does not act in time, has its holder told to stop and the box killed."""
    from quinebox.errors import QuineboxError
    from quinebox.sandbox import Sandbox

    code = 0
    for ref in refs:
        with reported():
            try:
                box = Sandbox.connect(ref)
                box.destroy()
            except QuineboxError as exc:  # one missing box, or one that stays, is said and does not keep the others; a bug is itself
                code = fail(exc).exit_code
                continue
        print(box.id)
    raise typer.Exit(code)


#: What `cp` copies out of a box at most unless --max-size says otherwise, and how long it may take.
CP_MAX = "1g"
CP_TIMEOUT = "10m"


@app.command("cp", help="Copy a file into a long-lived box or out of it: `cp FILE ID:/path`, `cp ID:/path FILE` (- is stdin or stdout).")
def cp_command(
    source: str = typer.Argument(..., metavar="SRC"),
    dest: str = typer.Argument(..., metavar="DEST"),
    max_size: str = typer.Option(CP_MAX, "--max-size", metavar="SIZE", help="Copy out at most this much (a larger file is refused)."),
    timeout: str = typer.Option(CP_TIMEOUT, "--timeout", metavar="DURATION", help="Give up a copy that takes longer than this."),
) -> None:
    from quinebox.box.live import sandboxes
    from quinebox.box.live.freezing import refuse_if_paused
    from quinebox.errors import GrantError
    from quinebox.grants import parse_duration, parse_size

    inside = [":" in side and not side.startswith(("/", ".")) for side in (source, dest)]
    if inside.count(True) != 1:
        say("give one side as ID:/path in the box and the other as a path here, as in `quinebox cp notes.txt ID:/world/notes.txt`")
        raise typer.Exit(2)
    try:
        cap, seconds = parse_size(max_size), parse_duration(timeout)
    except GrantError as exc:
        say(f"{exc} (--max-size, --timeout)")
        raise typer.Exit(2) from None
    with reported():
        if inside[0]:
            ref, _, path = source.partition(":")
            record, _ = sandboxes.find(ref)
            refuse_if_paused(record.session)
            with sandboxes.Running(record.session):
                _copy_out(record, path, dest, cap, seconds)
        else:
            ref, _, path = dest.partition(":")
            record, _ = sandboxes.find(ref)
            refuse_if_paused(record.session)
            data = _read_here(source)
            with sandboxes.Running(record.session):
                _write_in(record, path, data, source, seconds)


def _copy_out(record: Record, path: str, dest: str, cap: int, timeout: float) -> None:
    """The box's file into `dest` as it comes (a new file is renamed into place once whole), or onto stdout."""
    from quinebox.box.live import box_files

    where = _via(record)
    target = dest if dest == "-" else os.path.join(dest, os.path.basename(path)) if os.path.isdir(dest) else dest
    out, scratch = _open_here(target)
    failed: list[OSError] = []

    def take(chunk: bytes) -> None:
        if not failed:
            try:
                out.write(chunk)
            except OSError as exc:
                failed.append(exc)

    try:
        box_files.read_into(where, path, take, max_bytes=cap, timeout=timeout, raise_it="give cp --max-size SIZE")
        if not failed:
            out.flush()
    except OSError as exc:
        _discard(out, scratch)
        say(f"cannot copy {path} out of the box: {exc.strerror or exc}" + (" (cp copies one file)" if isinstance(exc, IsADirectoryError) else ""))
        raise typer.Exit(1) from None
    except BaseException:
        _discard(out, scratch)
        raise
    if failed:
        _discard(out, scratch)
        say(f"cannot write {target}: {failed[0].strerror or failed[0]}")
        raise typer.Exit(1)
    if scratch is not None:
        out.close()
        os.replace(scratch, target)


def _open_here(target: str):  # -> (a binary file, the scratch name to rename to `target` once whole, or None)
    """Where a copy out goes: stdout, what `target` already is when that is no regular file (a FIFO, /dev/null), or
    a new file beside it."""
    import stat

    if target == "-":
        return sys.stdout.buffer, None
    try:
        if os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
            return open(target, "wb"), None
        scratch = os.path.join(os.path.dirname(target) or ".", f".{os.path.basename(target)}.quinebox-{os.getpid()}")
        return os.fdopen(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), "wb"), scratch
    except OSError as exc:
        say(f"cannot write {target}: {exc.strerror}")
        raise typer.Exit(1) from None


def _discard(out, scratch: str | None) -> None:
    """A copy that failed leaves no file behind it."""
    if scratch is not None:
        out.close()
        os.unlink(scratch)


def _via(record: Record) -> Via:
    """Where cp's copier runs: handed to the box's owner, which starts it by the box's init (as `exec --in` is; a bwrap
    box has no other way in), or by the box's backend where no owner answers (an attached Sandbox's Popen)."""
    from quinebox.box.live import box_files
    from quinebox.sandbox import Sandbox

    attached = Sandbox._attach(record)
    return box_files.Via(attached.target, attached.Popen)


def _write_in(record: Record, path: str, data: bytes, source: str, timeout: float) -> None:
    from quinebox.box.live import box_files

    if path.endswith("/"):
        path += os.path.basename(source) if source != "-" else "stdin"
    try:
        box_files.write_bytes(_via(record), path, data, timeout=timeout)
    except OSError as exc:
        say(f"cannot copy into {path} in the box: {exc.strerror or exc}")
        raise typer.Exit(1) from None


def _read_here(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as exc:
        say(f"cannot read {source}: {exc.strerror}" + (" (cp copies one file)" if isinstance(exc, IsADirectoryError) else ""))
        raise typer.Exit(1) from None


