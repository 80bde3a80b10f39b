"""The MCP tools on a box's /world: its revisions (world_log), what one changed (world_diff), rolling back to one
(restore_revision) and taking one out as a tar archive (export_world), to a new host file only within a
directory the server holds rw, opened without following a link.
"""

from __future__ import annotations

import base64
import io
import os
import tempfile
from pathlib import PurePosixPath
from typing import Any

from quinebox.grants import within
from quinebox.integrations.mcp_boxes import Boxes, look
from quinebox.integrations.mcp_checks import DEFAULT_EXPORT, DEFAULT_OUTPUT, MAX_EXPORT, MAX_OUTPUT, MAX_PATH, Refused, shown, size, text


class WorldTools(Boxes):
    """world_log, world_diff, restore_revision and export_world."""

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

    def known(self, sb: Any, *revs: int | None) -> None:
        have = [r["rev"] for r in sb.world.log()]
        for rev in revs:
            if rev is not None and rev not in have:
                raise Refused(f"box {sb.id} has no revision {rev} (it has {have[0]} to {have[-1]})" if have else f"box {sb.id} has no revisions")

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
            except FileExistsError:
                raise Refused(f"{path} exists: give a new file's path") from None
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise Refused(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            os.close(root_fd)


class CappedFile(io.BytesIO):
    """A BytesIO that refuses to grow past `cap` (an export returned inline)."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.cap:
            raise Refused(f"the archive is more than {self.cap} bytes: give max_bytes (at most {MAX_EXPORT}) or a path to write it to")
        return super().write(data)
