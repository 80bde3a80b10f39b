"""The MCP server's file tools' helper, run inside a box by the box's own Python: a program, not host code.

It resolves, reads, lists and restores files as the box's user and as the box sees them, so that a link inside
the box is followed where it points there, and one out of the paths the box's file tools reach is refused. It is
kept apart as one program text (the server runs it with `python -c`), so that it imports nothing of quinebox and
works in any image with a Python.
"""

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
def what(m): return next(n for t, n in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                                        (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (bool, "special file")) if t(m))
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
