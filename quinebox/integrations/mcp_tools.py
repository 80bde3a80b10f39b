"""The MCP tools on boxes: make, list and remove them, run commands in them, and read, write, edit and list their files.

Every box holds at most the server's grants, and the file tools stay within its /world and the paths it was
granted, resolved inside the box (HELPER: a link out of them is refused). Each tool checks what it is given
(mcp_checks) and says what a person can run to look (`look`).
"""

from __future__ import annotations

import base64
import json
import shlex
from typing import Any

from quinebox.audit import log
from quinebox.errors import ImageError
from quinebox.integrations.mcp_boxes import Boxes, look
from quinebox.integrations.mcp_checks import (
    DEFAULT_OUTPUT,
    DEFAULT_READ,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    ENV_PATTERN,
    IMAGE_PATTERN,
    MAX_ENTRIES,
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
    Refused,
    box_path,
    held,
    lifetime,
    narrow,
    number,
    shown,
    size,
    strings,
    text,
)


class BoxTools(Boxes):
    """create_sandbox, list_sandboxes, remove_sandbox, exec, read_file, write_file, edit_file and list_files."""

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
            sb = Sandbox(image=image, grants=granted.format(), deny=self.deny, ttl=seconds, name=name, pull=self.pull(image),
                         backend=self.backend, runtime=self.runtime)
        except ImageError as exc:
            if self.pull(image) == "never" and "not here" in str(exc):
                raise Refused(f"image {image} is not on this machine, and this server pulls no image a client names: `docker pull {image}` on the host first") from None
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

    def _read(self, sb: Any, path: str, offset: int, limit: int) -> tuple[str, int, bytes]:
        raw = self.helper(sb, "read", cap=limit + MAX_PATH * 2, path=path, offset=offset, limit=limit)
        head, _, body = raw.partition(b"\n")
        meta = json.loads(head)
        return meta["path"], int(meta["size"]), body

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
            except ValueError:
                raise Refused("content is not valid base64") from None
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
        except UnicodeDecodeError:
            raise Refused(f"{real} is not UTF-8 text") from None
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
