"""The MCP server (`quinebox mcp`): quinebox's long-lived boxes as tools for any MCP client, over stdio or HTTP.

A client (Claude Code, Codex, any agent speaking the Model Context Protocol) makes boxes, runs commands and
reads, writes and edits files in them, looks at and rolls back their worlds, pauses, snapshots and forks them,
and runs quinebox agents. The server's grants (-g, --policy) are the ceiling: every box it makes holds at most
those (grants.attenuate, as a box's child does), and a request for more is refused in one line and recorded in
the audit log as `child_refused`. The boxes are the server's: they end with it (its death included), and a
client reaches only the boxes this server made, the snapshots it took and the sessions it ran.

Nothing a client sends is trusted: every argument is checked and capped (mcp_checks), each tool's failure is one
line for that call (never the server's end), and the file tools stay within the box's /world and the paths it
was granted, resolved inside the box by the in-box helper (mcp_helper: a link out of them is refused).

One class, `QuineboxMCP`, is the server: its state (the ceiling, the boxes, the snapshots, the sessions) and
every tool on it, since each tool is a few checks around that shared state. Only this module imports `mcp`:
here too are the SDK's server with every tool's failure one line and unknown arguments refused, and the
transports (stdio; HTTP on loopback behind a bearer token).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hmac
import json
import os
import secrets
import shlex
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent
from pydantic import ConfigDict, ValidationError

from quinebox import DEVNULL
from quinebox.audit import log
from quinebox.box.options import BoxOptions
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.spec import DEFAULT_IMAGE, load_policy, protected_paths
from quinebox.errors import ErrorKind, ImageError, QuineboxError
from quinebox.grants import Grants, resolve, within
from quinebox.integrations.mcp_checks import (
    DEFAULT_EXPORT,
    DEFAULT_OUTPUT,
    DEFAULT_READ,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    ENV_PATTERN,
    IMAGE_PATTERN,
    MAX_BOXES,
    MAX_COPIES,
    MAX_ENTRIES,
    MAX_EXPORT,
    MAX_INPUT,
    MAX_OUTPUT,
    MAX_PATH,
    MAX_READ,
    MAX_TEXT,
    MAX_TIMEOUT,
    MAX_TTL,
    MAX_WRITE,
    NAME_PATTERN,
    WORLD,
    Capped,
    CappedFile,
    Refused,
    box_path,
    held,
    lifetime,
    narrow,
    number,
    one_line,
    shown,
    size,
    strings,
    text,
)
from quinebox.integrations.mcp_helper import HELPER
from quinebox.state import state_dir


class QuineboxMCP:
    """The server: its ceiling of grants, the boxes it made, the snapshots it took, the sessions it ran, every tool on
    them, and `mcp`, the MCP server that serves them."""

    def __init__(
        self,
        grants: list[str] | tuple[str, ...] = (),
        *,
        model: str | None = None,
        max_boxes: int = MAX_BOXES,
        cwd: str | None = None,
        **options: Any,
    ):
        """`grants` (with a `policy`'s) are the ceiling of every box the server makes; `options`, by BoxOptions' names
        (policy, image, backend, runtime, deny, …), what each box starts from. An unknown name is BoxOptions'
        TypeError, naming it."""
        self.cwd = cwd or os.getcwd()
        given = BoxOptions.of(grants=tuple(grants), **options)
        lists = load_policy(given.policy) if given.policy else {}
        parsed = Grants.parse([*lists.get("grants", []), *given.grants], cwd=self.cwd)
        self.ceiling = resolve(parsed, environ=os.environ, protected=protected_paths(os.environ, state_dir()))
        #: What every box this server makes starts from; a box adds the grants its client got within the ceiling, and
        #: its image (`options_for`). The policy is read here, once: its grants are in the ceiling, its deny rules,
        #: backend and runtime in these.
        self.options = replace(
            given, grants=(), policy=None, image=given.image or DEFAULT_IMAGE, deny=(*lists.get("deny", []), *given.deny),
            backend=given.backend or lists.get("backend"), runtime=given.runtime or lists.get("runtime"),
        )
        self.model = model
        self.max_boxes = max_boxes
        #: The boxes this server made, and the paths each one's file tools reach.
        self.boxes: dict[str, Any] = {}
        self.roots: dict[str, list[str]] = {}
        #: The sessions its missions ran (fork_session goes on from those only).
        self.sessions: set[str] = set()
        #: Boxes starting and missions running: counted against `max_boxes` with the boxes made.
        self.starting = self.missions = 0
        self.lock = threading.Lock()
        #: One lock per box: its world's revisions are committed one at a time.
        self.revising: dict[str, threading.Lock] = {}
        #: The snapshots this server made, and the files each one's box reached.
        self.snapshots: dict[str, Any] = {}
        self.snapshot_roots: dict[str, list[str]] = {}
        self.snapshot_lock = threading.Lock()
        self.mcp = Server("quinebox", instructions=INSTRUCTIONS, log_level="WARNING", tools=[strict(fn, name) for name, fn in self.tools().items()])

    def tools(self) -> dict[str, Callable[..., Any]]:
        return {
            "create_sandbox": self.create_sandbox, "list_sandboxes": self.list_sandboxes, "remove_sandbox": self.remove_sandbox,
            "exec": self.exec, "read_file": self.read_file, "write_file": self.write_file, "edit_file": self.edit_file,
            "list_files": self.list_files, "world_log": self.world_log, "world_diff": self.world_diff,
            "restore_revision": self.restore_revision, "export_world": self.export_world,
            "run_mission": self.run_mission, "fork_session": self.fork_session,
            "pause_sandbox": self.pause_sandbox, "resume_sandbox": self.resume_sandbox, "checkpoint_sandbox": self.checkpoint_sandbox,
            "restore_sandbox": self.restore_sandbox, "fork_sandbox": self.fork_sandbox, "list_snapshots": self.list_snapshots,
            "remove_snapshot": self.remove_snapshot,
        }

    # -- boxes: make, list and remove them ----------------------------------------------------------

    def create_sandbox(self, image: str | None = None, grants: list[str] | None = None, ttl: float | str | None = None,
                       name: str | None = None) -> dict[str, Any]:
        """Make a long-lived hardened box (no network, read-only root, non-root, its own /world with revisions).
        grants: grant strings (rw:PATH, ro:PATH, net:HOST, mem:512m, cpus:1, env:NAME, ...), each within this server's;
        ttl: seconds or a duration (30m) until the box is removed (default 1h); name: to refer to it instead of its id."""
        from quinebox import Sandbox

        image = text(image, "image", 255) if image is not None else self.image
        if not IMAGE_PATTERN.match(image):
            raise Refused(f"bad image {image!r}: give an image reference, as python:3.12-slim")
        if name is not None and not NAME_PATTERN.match(text(name, "name", 63)):
            raise Refused(f"bad name {name!r}: letters, digits, '.', '_' and '-', at most 63")
        asked = strings(grants, "grants")
        seconds = lifetime(self.ceiling, ttl, "ttl", DEFAULT_TTL, MAX_TTL)
        granted = narrow(self.ceiling, asked, "create_sandbox", cwd=self.cwd)
        with self.lock:
            for ended in [key for key, sb in self.boxes.items() if sb.returncode is not None]:  # their TTL ran out
                self.boxes.pop(ended).close()
            if len(self.boxes) + self.starting >= self.max_boxes:
                raise Refused(f"this server already holds {self.max_boxes} boxes: remove_sandbox one first")
            self.starting += 1
        try:
            sb = Sandbox(self.options_for(granted, image), ttl=seconds, name=name)
        except ImageError as exc:
            if exc.kind is ErrorKind.NOT_FOUND and self.pull(image) == "never":
                raise Refused(f"image {image} is not on this machine, and this server pulls no image a client names: `docker pull {image}` on the host first") from exc
            raise
        finally:
            with self.lock:
                self.starting -= 1
        with self.lock:
            self.boxes[sb.id] = sb
            self.roots[sb.id] = [WORLD, *sorted({m.dest for m in granted.mounts})]
        log.note("child_allowed", sb.id, by="mcp", tool="create_sandbox", grants=granted.format(), image=image)
        return {"box": sb.id, "name": sb.name, "image": image, "grants": granted.format(), "ttl_s": seconds,
                "files": self.roots[sb.id], "look": look(sb.id)}

    def list_sandboxes(self) -> dict[str, Any]:
        """The boxes this server made: id, name, whether each still runs, whether it is paused."""
        with self.lock:
            boxes = list(self.boxes.values())
        return {"boxes": [{"box": sb.id, "name": sb.name, "running": sb.returncode is None, "paused": sb.paused, "files": self.roots.get(sb.id),
                           "look": look(sb.id)} for sb in boxes], "server_grants": held(self.ceiling)}

    def remove_sandbox(self, box: str) -> dict[str, Any]:
        """Remove a box and everything running in it (its world's history stays readable with `quinebox world log`)."""
        sb = self.box(box)
        with self.lock:
            self.boxes.pop(sb.id, None)
        sb.close()
        return {"box": sb.id, "removed": True, "look": {"log": f"quinebox world log {sb.id}"}}

    # -- commands -----------------------------------------------------------------------------------

    def exec(self, box: str, argv: list[str] | None = None, command: str | None = None, cwd: str | None = None,
             env: dict[str, str] | None = None, timeout: float | None = None, input: str | None = None,
             max_output: int | None = None) -> dict[str, Any]:
        """Run a command in a box: argv (a list, run as is) or command (a string for /bin/sh -c), not both.
        timeout in seconds (default 120; the command's whole process tree is killed, exit 124, the box stays);
        input: its stdin; max_output: bytes kept of stdout and of stderr each (default 65536), the rest counted."""
        sb = self.box(box)
        if (argv is None) == (command is None):
            raise Refused("give argv (a list) or command (a shell string), one of them")
        words = strings(argv, "argv", 4096) if argv is not None else ["/bin/sh", "-c", text(command, "command")]
        if not words or "\0" in words[-1]:
            raise Refused("nothing to run (or a NUL in command)")
        if cwd is not None and (not text(cwd, "cwd", MAX_PATH).startswith("/") or "\0" in cwd):
            raise Refused("cwd must be an absolute path in the box")
        if env is not None:
            if not isinstance(env, dict) or len(env) > 256 or not all(isinstance(v, str) and "\0" not in v and len(v) <= MAX_TEXT for v in env.values()):
                raise Refused("env must map at most 256 names to strings without NUL")
            bad = [k for k in env if not ENV_PATTERN.match(k)]
            if bad:
                raise Refused(f"bad environment variable name {bad[0][:64]!r}")
        seconds = number(timeout, "timeout", DEFAULT_TIMEOUT, MAX_TIMEOUT)
        data = text(input, "input", MAX_INPUT, empty=True).encode() if input is not None else None
        cap = size(max_output, "max_output", DEFAULT_OUTPUT, MAX_OUTPUT)
        code, out, err, timed_out = self.run_in(sb, words, stdin=data, cap=cap, timeout=seconds, cwd=cwd, env=env)
        rev = self.revise(sb, "exec " + shlex.join(words)[:500])
        return {
            "box": sb.id, "exit_code": code, "timed_out": timed_out, "stdout": shown(out.data, out.cut), "stderr": shown(err.data, err.cut),
            "stdout_bytes_cut": out.cut, "stderr_bytes_cut": err.cut, "world_revision": rev, "look": look(sb.id),
        }

    # -- files --------------------------------------------------------------------------------------

    def read_file(self, box: str, path: str, offset: int = 0, limit: int | None = None, encoding: str = "text") -> dict[str, Any]:
        """Read a file of the box's /world (or of a path it was granted); relative paths are /world's.
        offset/limit in bytes (default limit 262144, at most 4194304); encoding: text (UTF-8) or base64."""
        sb = self.box(box)
        full = box_path(path, self.roots[sb.id])
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise Refused("offset must be a whole number, 0 or more")
        limit = size(limit, "limit", DEFAULT_READ, MAX_READ)
        if encoding not in ("text", "base64"):
            raise Refused("encoding is text or base64")
        real, total, body = self._read(sb, full, offset, limit)
        content = base64.b64encode(body).decode() if encoding == "base64" else body.decode("utf-8", errors="replace")
        left = max(0, total - offset - len(body))
        return {"box": sb.id, "path": real, "size": total, "offset": offset, "content": content, "bytes_not_read": left,
                **({"note": f"{left} more bytes: read again with offset={offset + len(body)}"} if left else {}), "look": look(sb.id)}

    def write_file(self, box: str, path: str, content: str, encoding: str = "text") -> dict[str, Any]:
        """Write a whole file (its missing parent directories made) in the box's /world or a path it was granted rw.
        encoding: text (content is written as UTF-8) or base64."""
        sb = self.box(box)
        full = box_path(path, self.roots[sb.id])
        content = text(content, "content", MAX_WRITE * 2, empty=True)
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError as exc:
                raise Refused("content is not valid base64") from exc
        elif encoding == "text":
            data = content.encode()
        else:
            raise Refused("encoding is text or base64")
        if len(data) > MAX_WRITE:
            raise Refused(f"content is {len(data)} bytes; the most is {MAX_WRITE}")
        real = json.loads(self.helper(sb, "resolve", path=full))["path"]
        sb.write_file(real, data)
        return {"box": sb.id, "path": real, "bytes": len(data), "world_revision": self.revise(sb, f"write {real}"), "look": look(sb.id)}

    def edit_file(self, box: str, path: str, old_string: str, new_string: str, replace_all: bool = False) -> dict[str, Any]:
        """Replace old_string with new_string in a text file of the box, exactly; old_string must occur once
        (or give replace_all=true). The file is at most 4194304 bytes."""
        sb = self.box(box)
        full = box_path(path, self.roots[sb.id])
        old, new = text(old_string, "old_string", MAX_WRITE), text(new_string, "new_string", MAX_WRITE, empty=True)
        if old == new:
            raise Refused("old_string and new_string are the same")
        real, total, body = self._read(sb, full, 0, MAX_READ)
        if total > len(body):
            raise Refused(f"{real} is {total} bytes, more than edit_file takes ({MAX_READ}); use exec")
        try:
            before = body.decode()
        except UnicodeDecodeError as exc:
            raise Refused(f"{real} is not UTF-8 text") from exc
        count = before.count(old)
        if count == 0:
            raise Refused(f"old_string does not occur in {real}")
        if count > 1 and not replace_all:
            raise Refused(f"old_string occurs {count} times in {real}: give more context to make it unique, or replace_all=true")
        after = before.replace(old, new) if replace_all else before.replace(old, new, 1)
        if len(after.encode()) > MAX_WRITE:
            raise Refused(f"the edited file would be more than {MAX_WRITE} bytes")
        sb.write_file(real, after)
        return {"box": sb.id, "path": real, "replaced": count if replace_all else 1,
                "world_revision": self.revise(sb, f"edit {real}"), "look": look(sb.id)}

    def list_files(self, box: str, path: str = WORLD, recursive: bool = False, limit: int | None = None) -> dict[str, Any]:
        """List a directory of the box (default /world): each entry's path, type, size, mode, a link's target.
        recursive: the whole tree below; limit: at most this many entries (default 1000, at most 5000)."""
        sb = self.box(box)
        full = box_path(path, self.roots[sb.id])
        listed = json.loads(self.helper(sb, "ls", cap=4 << 20, path=full, recursive=bool(recursive), limit=size(limit, "limit", 1000, MAX_ENTRIES)))
        return {"box": sb.id, **listed, "look": look(sb.id)}

    def _read(self, sb: Any, path: str, offset: int, limit: int) -> tuple[str, int, bytes]:
        raw = self.helper(sb, "read", cap=limit + MAX_PATH * 2, path=path, offset=offset, limit=limit)
        head, _, body = raw.partition(b"\n")
        meta = json.loads(head)
        return meta["path"], int(meta["size"]), body

    # -- worlds: revisions, diffs, rolling back, exporting ------------------------------------------

    def world_log(self, box: str) -> dict[str, Any]:
        """The revisions of a box's /world: one at the start, one after each command or write that changed it."""
        sb = self.box(box)
        revisions = [{"rev": r["rev"], "what": r.get("command") or r.get("what", ""), "paths": r.get("files", 0), "bytes": r.get("bytes", 0),
                      "changed": sorted(r.get("changes") or {})[:50], "time": r.get("t")} for r in sb.world.log()]
        return {"box": sb.id, "revisions": revisions[-500:], "look": look(sb.id)}

    def world_diff(self, box: str, rev: int | None = None, against: int | None = None, max_bytes: int | None = None) -> dict[str, Any]:
        """What revision rev (default: the newest) changed since against (default: the one before it), as a unified diff."""
        sb = self.box(box)
        for value, what in ((rev, "rev"), (against, "against")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise Refused(f"{what} must be a revision number, 0 or more")
        cap = size(max_bytes, "max_bytes", DEFAULT_OUTPUT, MAX_OUTPUT)
        self.known(sb, rev, against)
        diff = sb.world.diff(rev, against).encode()
        return {"box": sb.id, "diff": shown(diff[:cap], max(0, len(diff) - cap)), "bytes_cut": max(0, len(diff) - cap), "look": look(sb.id)}

    def restore_revision(self, box: str, rev: int) -> dict[str, Any]:
        """Put the box's /world back as it was at revision rev (a new revision records it; nothing is lost)."""
        sb = self.box(box)
        if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
            raise Refused("rev must be a revision number")
        self.known(sb, rev)
        with tempfile.TemporaryFile() as tar:
            skipped = sb.world.export(tar, rev)
            tar.seek(0)
            self.helper(sb, "restore", stdin=tar)
        return {"box": sb.id, "restored": rev, "left_out": (skipped or [])[:20], "world_revision": self.revise(sb, f"restore revision {rev}"),
                "look": look(sb.id)}

    def export_world(self, box: str, rev: int | None = None, path: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
        """A revision of the box's /world (default: the newest) as a tar archive: written to path on the host (a new
        file in a directory this server was granted rw), or returned as base64 (at most max_bytes, default 4194304)."""
        sb = self.box(box)
        if rev is not None and (isinstance(rev, bool) or not isinstance(rev, int)):
            raise Refused("rev must be a revision number")
        self.known(sb, rev)
        if path is None:
            cap = size(max_bytes, "max_bytes", DEFAULT_EXPORT, MAX_EXPORT)
            buffer = CappedFile(cap)
            skipped = sb.world.export(buffer, rev)
            return {"box": sb.id, "tar_base64": base64.b64encode(buffer.getvalue()).decode(), "bytes": buffer.tell(),
                    "left_out": (skipped or [])[:20], "look": look(sb.id)}
        fd, where = self.host_file(text(path, "path", MAX_PATH))
        with os.fdopen(fd, "wb") as out:
            skipped = sb.world.export(out, rev)
            written = out.tell()
        return {"box": sb.id, "path": where, "bytes": written, "left_out": (skipped or [])[:20], "look": look(sb.id)}

    def known(self, sb: Any, *revs: int | None) -> None:
        have = [r["rev"] for r in sb.world.log()]
        for rev in revs:
            if rev is not None and rev not in have:
                raise Refused(f"box {sb.id} has no revision {rev} (it has {have[0]} to {have[-1]})" if have else f"box {sb.id} has no revisions")

    def host_file(self, path: str) -> tuple[int, str]:
        """A new file at `path`, below a directory the server holds rw, opened without following any link."""
        from quinebox.worlds import beneath

        if "\0" in path or not path.startswith("/") or ".." in PurePosixPath(path).parts:
            raise Refused("path must be an absolute host path without '..'")
        roots = [m.source for m in self.ceiling.mounts if m.writable and within(path, m.source) and path != m.source]
        if not roots:
            writable = [m.source for m in self.ceiling.mounts if m.writable]
            raise Refused(f"path {path} is not in a directory this server holds rw ({', '.join(writable) or 'none'}); or leave path out for base64")
        root = max(roots, key=len)
        root_fd = os.open(root, beneath.DIR_FLAGS)
        try:
            dir_fd, name = beneath.open_parent(root_fd, os.path.relpath(path, root), create=True)
            try:
                return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd), path
            except FileExistsError as exc:
                raise Refused(f"{path} exists: give a new file's path") from exc
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise Refused(f"cannot write {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(root_fd)

    # -- agents: missions and forks of their sessions -----------------------------------------------

    def run_mission(self, mission: str, input: str | None = None, grants: list[str] | None = None, image: str | None = None,
                    timeout: float | str | None = None, max_turns: int | None = None, from_box: str | None = None) -> dict[str, Any]:
        """Run a quinebox agent on a mission in a fresh box (the server's model); input: its material on stdin;
        from_box: start its /world as a copy of that box's newest revision. Returns its deliverable (stdout),
        diagnostics (stderr), exit code and session, which fork_session can go on from."""
        mission = text(mission, "mission", 64 << 10)
        data = text(input, "input", MAX_INPUT, empty=True).encode() if input is not None else b""
        image = text(image, "image", 255) if image is not None else self.image
        if not IMAGE_PATTERN.match(image):
            raise Refused(f"bad image {image!r}")
        granted = narrow(self.ceiling, strings(grants, "grants"), "run_mission", cwd=self.cwd)
        seconds = lifetime(self.ceiling, timeout, "timeout", 600.0, MAX_TIMEOUT)
        turns = size(max_turns, "max_turns", 0, 1000) or None
        with tempfile.TemporaryDirectory(prefix="quinebox-mcp-") as scratch:
            world_tar = None
            if from_box is not None:
                world_tar = os.path.join(scratch, "world.tar")
                with open(world_tar, "wb") as tar:
                    self.box(from_box).world.export(tar)
            return self.agent(mission, self.options_for(granted, image, timeout=seconds, world_tar=world_tar), stdin=data, max_turns=turns)

    def fork_session(self, session: str, at: int, mission: str | None = None, grants: list[str] | None = None,
                     timeout: float | str | None = None, max_turns: int | None = None) -> dict[str, Any]:
        """Go on from turn `at` of a session this server ran: the model answers that turn afresh, in a world made
        again as it was then; mission: new instructions after the recorded conversation. grants default to the session's."""
        from quinebox.agent.tapes import find
        from quinebox.agent.timeline import moment

        session = text(session, "session", 64)
        with self.lock:
            mine = sorted(s for s in self.sessions if s.startswith(session))
        if len(mine) != 1:
            raise Refused(f"no session {session!r} run by this server (or more than one starts so): run_mission makes them")
        if isinstance(at, bool) or not isinstance(at, int) or at < 1:
            raise Refused("at must be a turn number, 1 or more")
        row = find(mine[0])
        then = moment(row.id, at)
        history = list(then.messages)
        if mission is not None:
            history.append({"role": "user", "content": f"New instructions from here on:\n\n{text(mission, 'mission', 64 << 10)}"})
        asked = strings(grants, "grants") if grants is not None else list(then.meta.get("grants") or [])
        granted = narrow(self.ceiling, asked, "fork_session", cwd=self.cwd)
        seconds = lifetime(self.ceiling, timeout, "timeout", 600.0, MAX_TIMEOUT)
        options = self.options_for(granted, then.meta.get("image"), timeout=seconds, workdir=then.meta.get("workdir"), world_at=(row.id, then.revision))
        return self.agent(
            mission or row.mission, options, max_turns=size(max_turns, "max_turns", 0, 1000) or None, stdin=b"", history=history,
            forked_from={"session": row.id, "turn": at, "revision": then.revision},
        )

    def agent(self, mission: str, options: BoxOptions, **run: Any) -> dict[str, Any]:
        """Run a mission in a box of `options` (`run`: its input, turns, history), counted against the server's most."""
        with self.lock:
            if self.missions >= self.max_boxes:
                raise Refused(f"this server already runs {self.max_boxes} missions: wait for one to end")
            self.missions += 1
        try:
            return self._agent(mission, options, **run)
        finally:
            with self.lock:
                self.missions -= 1

    def _agent(self, mission: str, options: BoxOptions, **run: Any) -> dict[str, Any]:
        from quinebox.tree.supervisor import start_agent

        out, err = Capped(MAX_OUTPUT), Capped(MAX_OUTPUT)
        # No one is asked (ask_timeout 0): a mission's box holds what the ceiling holds, no more.
        agent = start_agent(mission, options, model=self.model, stdout=out, stderr=err, ask_timeout=0, **run)
        code = agent.wait()
        session = agent.session.session
        with self.lock:
            self.sessions.add(session)
        outcome = agent.outcome or {}
        return {"session": session, "exit_code": code, "termination": outcome.get("termination"), "turns": outcome.get("turns"),
                "tokens": outcome.get("tokens"), "stdout": shown(out.data, out.cut), "stderr": shown(err.data, err.cut),
                "stdout_bytes_cut": out.cut, "stderr_bytes_cut": err.cut, "look": look_session(session)}

    # -- time: pause, snapshots, forks --------------------------------------------------------------

    def pause_sandbox(self, box: str) -> dict[str, Any]:
        """Stop every process of a box where it is; its ttl stands still, and exec into it is refused until resume_sandbox."""
        sb = self.box(box)
        sb.pause()
        return {"box": sb.id, "paused": True, "look": look(sb.id)}

    def resume_sandbox(self, box: str) -> dict[str, Any]:
        """Let every process of a paused box go on."""
        sb = self.box(box)
        sb.resume()
        return {"box": sb.id, "paused": False, "look": look(sb.id)}

    def checkpoint_sandbox(self, box: str) -> dict[str, Any]:
        """Snapshot a box (on gVisor): its memory, processes, open files, /tmp and /world at one instant; the box goes on.
        restore_sandbox makes a new live box from the snapshot."""
        sb = self.box(box)
        made = sb.checkpoint()
        with self.snapshot_lock:
            self.snapshots[made.id] = made
            self.snapshot_roots[made.id] = list(self.roots[sb.id])
        return {"snapshot": made.id, "box": sb.id, "bytes": made.size}

    def restore_sandbox(self, snapshot: str, ttl: float | str | None = None, name: str | None = None) -> dict[str, Any]:
        """A new live box from a snapshot this server made: a new id, its processes going on from the snapshot's instant,
        a world of its own. ttl: seconds or a duration (default 1h)."""
        from quinebox import Sandbox

        made = self._snapshot(snapshot)
        seconds = lifetime(self.ceiling, ttl, "ttl", DEFAULT_TTL, MAX_TTL)
        with self._making(1):
            sb = Sandbox.restore(made.id, ttl=seconds, name=text(name, "name", 63) if name is not None else None)
        self._adopt(sb, made.id)
        return {"box": sb.id, "name": sb.name, "from": made.id, "ttl_s": seconds, "files": self.roots[sb.id], "look": look(sb.id)}

    def fork_sandbox(self, box: str, copies: int = 2) -> dict[str, Any]:
        """copies (1 to 8) live copies of a box from one instant, each with a world of its own; the box goes on."""
        sb = self.box(box)
        if isinstance(copies, bool) or not isinstance(copies, int) or not 1 <= copies <= MAX_COPIES:
            raise Refused(f"copies is a whole number from 1 to {MAX_COPIES}")
        with self._making(copies):
            made = sb.fork(copies)
        for copy in made:
            with self.lock:
                self.boxes[copy.id] = copy
                self.roots[copy.id] = list(self.roots[sb.id])
        return {"box": sb.id, "copies": [copy.id for copy in made], "look": look(sb.id)}

    def list_snapshots(self) -> dict[str, Any]:
        """The snapshots this server made: id, the box it was of, its size."""
        with self.snapshot_lock:
            found = list(self.snapshots.values())
        return {"snapshots": [{"snapshot": s.id, "box": s.box, "bytes": s.size, "created": s.created} for s in found]}

    def remove_snapshot(self, snapshot: str) -> dict[str, Any]:
        """Remove a snapshot this server made."""
        from quinebox.box.live import snapshots

        made = self._snapshot(snapshot)
        with self.snapshot_lock:
            self.snapshots.pop(made.id, None)
        snapshots.remove(made)
        return {"snapshot": made.id, "removed": True}

    def _snapshot(self, ref: Any) -> Any:
        ref = text(ref, "snapshot", 64)
        with self.snapshot_lock:
            found = [s for key, s in self.snapshots.items() if key == ref or key.startswith(ref)]
        if len(found) != 1 or not ref:
            raise Refused(f"no snapshot {ref!r} made by this server: list_snapshots lists them")
        return found[0]

    @contextlib.contextmanager
    def _making(self, count: int) -> Iterator[None]:
        """Room for `count` more boxes, held while they start."""
        with self.lock:
            if len(self.boxes) + self.starting + count > self.max_boxes:
                raise Refused(f"this server holds {len(self.boxes)} boxes of its most {self.max_boxes}: remove_sandbox some first")
            self.starting += count
        try:
            yield
        finally:
            with self.lock:
                self.starting -= count

    def _adopt(self, sb: Any, snapshot: str) -> None:
        with self.lock:
            self.boxes[sb.id] = sb
            self.roots[sb.id] = list(self.snapshot_roots[snapshot])

    # -- what every tool shares: a client's box, a command in it, the in-box helper, a new revision ---

    def box(self, ref: Any) -> Any:
        ref = text(ref, "box", 128)
        with self.lock:
            found = self.boxes.get(ref) or next((b for b in self.boxes.values() if b.name == ref), None)
        if found is None:
            raise Refused(f"no box {ref!r} made by this server: list_sandboxes lists them")
        return found

    @property
    def image(self) -> str:
        """The server's own image: every box's, unless its client names another."""
        return self.options.image or DEFAULT_IMAGE

    def options_for(self, granted: Grants, image: str | None, **more: Any) -> BoxOptions:
        """A box's options: the server's, the grants its client got within the ceiling, its image (the server's unless
        named, and pulled only if it is the server's own), and `more` (a mission's time, its world)."""
        image = image or self.image
        return BoxOptions.of(self.options, grants=tuple(granted.format()), image=image, pull=self.pull(image), **more)

    def pull(self, image: str) -> str:
        """The server's own image may be fetched; a client's choice only if it is here (the host pulls nothing because a client asked)."""
        return "missing" if image == self.image else "never"

    def run_in(self, sb: Any, argv: list[str], *, stdin: Any = None, cap: int = MAX_OUTPUT, timeout: float = 60.0,
               cwd: str | None = None, env: dict[str, str] | None = None) -> tuple[int, Capped, Capped, bool]:
        out, err = Capped(cap), Capped(min(cap, MAX_OUTPUT))
        proc = sb.Popen(argv, stdin=DEVNULL if stdin is None else stdin, stdout=out, stderr=err, cwd=cwd, env=env)
        code = proc.wait_drained(timeout)
        return code, out, err, bool(proc.timed_out)

    def helper(self, sb: Any, op: str, cap: int = MAX_OUTPUT, stdin: Any = None, **args: Any) -> bytes:
        argv = [*GUEST_PYTHON, "-c", HELPER, json.dumps({"op": op, "roots": self.roots[sb.id], **args})]
        code, out, err, timed_out = self.run_in(sb, argv, stdin=stdin, cap=cap, timeout=600.0)
        if timed_out:
            raise Refused(f"{op} took longer than 600 s and was stopped")
        if code != 0:
            raise Refused(one_line(err.data.decode(errors="replace")) or f"{op} failed in the box (exit {code})")
        return out.data

    def revise(self, sb: Any, note: str) -> int | None:
        with self.lock:
            lock = self.revising.setdefault(sb.id, threading.Lock())
        with lock:
            try:
                sb.world.commit(note)
                revisions = sb.world.log()
            except QuineboxError:
                return None
        return revisions[-1]["rev"] if revisions else None

    # -- transports and the end ---------------------------------------------------------------------

    def serve_stdio(self) -> None:
        import signal

        import anyio

        def stop(signum: int, _frame: object) -> None:
            # Not an exception in the loop: its end would wait for the thread blocked reading stdin, and for every
            # call still running. The boxes go first (which ends those calls), then the process, 128+n.
            def end() -> None:
                try:
                    self.close()
                finally:
                    os._exit(128 + signum)

            threading.Thread(target=end, daemon=True).start()

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, stop)
        try:
            anyio.run(self.mcp.run_stdio_async)
        finally:
            self.close()

    def serve_http(self, *, port: int = 0, token: str | None = None, announce: Callable[[str], None] | None = None) -> None:
        """Streamable HTTP on 127.0.0.1 only, every request with `Authorization: Bearer TOKEN` (else 401)."""
        import socket

        import uvicorn

        given = token is not None
        token = token or secrets.token_urlsafe(32)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        (announce or (lambda line: print(f"quinebox: {line}", file=sys.stderr, flush=True)))(
            f"serving MCP on {url} with the header 'Authorization: Bearer {'<the token given>' if given else token}' (Ctrl-C stops)"
        )
        app = Bearer(self.mcp.streamable_http_app(host="127.0.0.1"), token)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5))
        try:
            server.run(sockets=[sock])
        finally:
            self.close()

    def close(self) -> None:
        """Remove every box this server made, then the snapshots it took (at its end)."""
        from quinebox.box.live import snapshots

        with self.lock:
            boxes, self.boxes = list(self.boxes.values()), {}
        threads = [threading.Thread(target=sb.close, daemon=True) for sb in boxes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        with self.snapshot_lock:
            made, self.snapshots = list(self.snapshots.values()), {}
        for snapshot in made:
            try:
                snapshots.remove(snapshot)
            except OSError:
                pass


def look(box: str) -> dict[str, str]:
    """What a person runs to see what a box holds and did."""
    from quinebox import Sandbox

    return {"shell": Sandbox.connection_command(box), "diff": f"quinebox world diff {box}", "log": f"quinebox world log {box}"}


def look_session(session: str) -> dict[str, str]:
    """What a person runs to see what a mission's session did, and to go on from one of its turns."""
    return {"show": f"quinebox show {session}", "logs": f"quinebox logs {session}", "diff": f"quinebox world diff {session}",
            "fork": f"quinebox fork {session} --at TURN"}


class Server(MCPServer):
    """The SDK's server, its argument errors one line like every other tool error (the SDK's span many)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.__cause__.errors()[:10])
            return failed(f"bad arguments for {name}: {wrong}")


class Bearer:
    """ASGI: HTTP requests without the server's bearer token get 401; everything else goes on to `app`."""

    def __init__(self, app: Any, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                body = b'{"error": "unauthorized: send the header Authorization: Bearer TOKEN that quinebox mcp printed"}'
                headers = [(b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="quinebox"'), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A tool whose every failure is one line for this call: the client's mistake, a refusal, or quinebox's error."""

    @functools.wraps(fn)
    async def tool(**kwargs: Any) -> CallToolResult:
        import anyio

        # In a worker thread, abandoned when the call is cancelled or the server stops: a long exec holds neither up
        # (the server's end removes the box, which ends the exec).
        return await anyio.to_thread.run_sync(functools.partial(called, **kwargs), abandon_on_cancel=True)

    def called(**kwargs: Any) -> CallToolResult:
        try:
            result = fn(**kwargs)
        except (Refused, QuineboxError) as exc:
            return failed(str(exc))
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            return failed(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a tool's crash is that call's, never the server's
            traceback.print_exc(file=sys.stderr)
            return failed(f"internal error ({type(exc).__name__}): {exc}")
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(result, indent=1, ensure_ascii=False))], structured_content=result)

    return tool


def failed(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=one_line(message))], is_error=True)


def strict(fn: Callable[..., Any], name: str) -> Tool:
    """The tool, its arguments checked with unknown ones refused (the SDK would drop them silently)."""
    tool = Tool.from_function(guarded(fn), name=name, structured_output=False)
    base = tool.fn_metadata.arg_model

    class Arguments(base):  # type: ignore[misc, valid-type]  # a base known only at run time (the SDK's model of fn's arguments)
        model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    Arguments.__name__ = base.__name__
    tool.fn_metadata.arg_model = Arguments
    tool.parameters["additionalProperties"] = False
    return tool


INSTRUCTIONS = """quinebox: hardened boxes for running commands and agents. create_sandbox makes a box (its id is used
by every other tool); exec runs a command in it; read_file / write_file / edit_file / list_files work on its /world
(and paths it was granted); world_log / world_diff / restore_revision / export_world show and roll back what changed;
pause_sandbox / resume_sandbox stop and go on, checkpoint_sandbox / restore_sandbox / fork_sandbox copy a live box (gVisor).
Every box holds at most this server's grants. Each result says what a person can run to look (`look`)."""
