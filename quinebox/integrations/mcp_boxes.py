"""The state every MCP tool shares: the boxes the server made, and running commands and the file helper in them.

`Boxes` holds the server's ceiling of grants, the boxes it made (each with the paths its file tools reach),
the sessions it ran, how many boxes are starting and missions running; it finds a client's box by id or name, runs
a command in one with its output capped, runs HELPER (the in-box file helper) there, commits a box's /world
after a change, and removes every box at the server's end. The tool modules (mcp_tools, mcp_worlds,
mcp_missions) subclass it; mcp_server puts them together into the server.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from quinebox import DEVNULL
from quinebox.box.policy import GUEST_PYTHON
from quinebox.box.spec import DEFAULT_IMAGE, load_policy, protected_paths
from quinebox.errors import QuineboxError
from quinebox.grants import Grants, resolve
from quinebox.integrations.mcp_checks import MAX_BOXES, MAX_OUTPUT, Capped, Refused, one_line, text
from quinebox.state import state_dir

#: In-box helper (the guest's own Python, so any image works): resolves, reads, lists and restores as the box's
#: user, within `roots` as the box sees them. A failure is one line on stderr and exit 3.
HELPER = r'''
import json, os, shutil, stat, sys, tarfile
a = json.loads(sys.argv[1]); roots = a["roots"]
def fail(m): sys.stderr.write(m + "\n"); sys.exit(3)
def inside(p): return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)
def real(p):
    r = os.path.realpath(p)
    if not inside(r): fail(f"{p} resolves to {r}, outside {', '.join(roots)}: the file tools follow no link out of them")
    return r
def kind(m): return "dir" if stat.S_ISDIR(m) else "file" if stat.S_ISREG(m) else "link" if stat.S_ISLNK(m) else "other"
def what(m): return next(n for t, n in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (bool, "special file")) if t(m))
try:
    op = a["op"]
    if op == "read":
        p = real(a["path"]); st = os.stat(p)  # a socket or a device is never opened; what was opened is checked again
        if stat.S_ISREG(st.st_mode): fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK); st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode): fail(f"{a['path']} is not a regular file (a {what(st.st_mode)}): read_file reads regular files only")
        out = sys.stdout.buffer; out.write(json.dumps({"path": p, "size": st.st_size}).encode() + b"\n")
        os.lseek(fd, a["offset"], 0); left = a["limit"]
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk: break
            out.write(chunk); left -= len(chunk)
    elif op == "resolve":
        print(json.dumps({"path": real(a["path"])}))
    elif op == "ls":
        top = real(a["path"]); found = []; cut = False
        if not os.path.isdir(top): fail(f"{a['path']} is not a directory")
        for d, dirs, files in os.walk(top):
            dirs.sort()
            for n in sorted(dirs + files):
                p = os.path.join(d, n); st = os.lstat(p)
                e = {"path": os.path.relpath(p, top), "type": kind(st.st_mode), "size": st.st_size, "mode": oct(st.st_mode & 0o7777)}
                if stat.S_ISLNK(st.st_mode): e["target"] = os.readlink(p)
                if len(found) >= a["limit"]: cut = True; break
                found.append(e)
            if cut or not a["recursive"]: break
        print(json.dumps({"path": top, "entries": found, "truncated": cut}))
    elif op == "restore":
        top = roots[0]
        for n in os.listdir(top):
            p = os.path.join(top, n)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as t:
            t.extractall(top, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
except OSError as e:
    fail(f"{a.get('path') or e.filename or ''}: {e.strerror}")
'''


def look(box: str) -> dict[str, str]:
    """What a person runs to see what a box holds and did."""
    from quinebox import Sandbox

    return {"shell": Sandbox.connection_command(box), "diff": f"quinebox world diff {box}", "log": f"quinebox world log {box}"}


class Boxes:
    """The server's state: its ceiling of grants, the boxes it made, the sessions it ran."""

    def __init__(
        self,
        grants: list[str] | tuple[str, ...] = (),
        *,
        policy: str | None = None,
        image: str | None = None,
        backend: str | None = None,
        runtime: str | None = None,
        model: str | None = None,
        max_boxes: int = MAX_BOXES,
        cwd: str | None = None,
    ):
        self.cwd = cwd or os.getcwd()
        lists = load_policy(policy) if policy else {}
        parsed = Grants.parse([*lists.get("grants", []), *grants], cwd=self.cwd)
        self.ceiling = resolve(parsed, environ=os.environ, protected=protected_paths(os.environ, state_dir()))
        self.deny = list(lists.get("deny", []))
        self.image = image or DEFAULT_IMAGE
        self.backend = backend or lists.get("backend")
        self.runtime = runtime or lists.get("runtime")
        self.model = model
        self.max_boxes = max_boxes
        self.boxes: dict[str, Any] = {}
        self.roots: dict[str, list[str]] = {}
        self.sessions: set[str] = set()
        self.starting = self.missions = 0
        self.lock = threading.Lock()
        self.revising: dict[str, threading.Lock] = {}

    def pull(self, image: str) -> str:
        """The server's own image may be fetched; a client's choice only if it is here (the host pulls nothing because a client asked)."""
        return "missing" if image == self.image else "never"

    def box(self, ref: Any) -> Any:
        ref = text(ref, "box", 128)
        with self.lock:
            found = self.boxes.get(ref) or next((b for b in self.boxes.values() if b.name == ref), None)
        if found is None:
            raise Refused(f"no box {ref!r} made by this server: list_sandboxes lists them")
        return found

    def run_in(self, sb: Any, argv: list[str], *, stdin: Any = None, cap: int = MAX_OUTPUT, timeout: float = 60.0,
               cwd: str | None = None, env: dict[str, str] | None = None) -> tuple[int, Capped, Capped, bool]:
        out, err = Capped(cap), Capped(min(cap, MAX_OUTPUT))
        proc = sb.Popen(argv, stdin=DEVNULL if stdin is None else stdin, stdout=out, stderr=err, cwd=cwd, env=env)
        code = proc.wait(timeout)
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

    def close(self) -> None:
        """Remove every box this server made (at its end)."""
        with self.lock:
            boxes, self.boxes = list(self.boxes.values()), {}
        threads = [threading.Thread(target=sb.close, daemon=True) for sb in boxes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
