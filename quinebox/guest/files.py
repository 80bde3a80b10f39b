"""A long-lived box's files, from inside it: `files.py read PATH [CAP]`, `write PATH`, `list PATH`, `stat PATH
[follow]`, `remove PATH [recursive]`, `mkdir PATH PARENTS EXIST_OK`, `gettar PATH CAP`, `puttar DIR CAP UNTAR`.

The host runs this as an exec (its source sent with `python -c`, so it is always the host's own version), as the
box's user, so the kernel decides what may be read or written, through
the box's own mounts and links, as for any command there. read: the file's bytes on stdout, at most CAP of
them; write: stdin into the file, its missing parent directories made, replaced whole (a reader never sees
half of it). Each failure is an exit status the host turns back into Python's own error (box/live/sandboxes.py),
its reason on stderr.

The box may have made PATH anything: only a regular file is opened, never blocking (a FIFO nobody writes
would hang the read; a device or a socket is not a file's bytes), and no more than CAP bytes are read (a file
the box keeps growing never ends). The host holds its own cap and deadline too: this only makes the refusal
quick and clear. list and stat say what a path is without opening it (a link is a link: lstat). gettar writes a
tar of a file, or of a directory's contents, to stdout: links as links, never followed, FIFOs, sockets and devices
left out, each file opened without blocking or following a link, at most CAP bytes. puttar takes a tar on stdin
(at most CAP bytes), spools it beside its destination (a file whose name is gone at once: read again only through its fd), and unpacks it with quinebox's untar.py (its source is
UNTAR, the host's own): every header checked before a byte is written, nothing written through a link, no member
outside DIR, no device or FIFO; the box's Python (3.11.2) has no `data` filter of tarfile's.

Runs inside untrusted boxes: stdlib only, small.
"""

import errno
import json
import os
import shutil
import stat
import sys
import tarfile
import types

#: Exit statuses, one per error the host raises again.
NOT_FOUND, IS_A_DIRECTORY, NOT_PERMITTED, OTHER, NOT_A_DIRECTORY, NOT_A_FILE, TOO_LARGE = 2, 3, 4, 5, 6, 7, 8
EXISTS, REFUSED, NOT_EMPTY = 9, 10, 11
CODES = {errno.ENOENT: NOT_FOUND, errno.EISDIR: IS_A_DIRECTORY, errno.EACCES: NOT_PERMITTED, errno.EPERM: NOT_PERMITTED,
         errno.EROFS: NOT_PERMITTED, errno.ENOTDIR: NOT_A_DIRECTORY, errno.EEXIST: EXISTS, errno.ENOTEMPTY: NOT_EMPTY}
#: The most members an archive put into the box may have.
MAX_MEMBERS = 1_000_000
CHUNK = 1 << 16
KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotAFile(Exception):
    """What is at the path is not a regular file (a FIFO, a socket, a device): the message says which."""


class TooLarge(Exception):
    """The file has more bytes than the caller's cap: the message starts with how many (or the cap + 1)."""


class Refused(Exception):
    """An archive that will not be unpacked: the message names the member and why."""


def kind(mode):
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def check(st):
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise NotAFile(f"{kind(st.st_mode)}, not a regular file")


def read(path, cap):
    check(os.stat(path))  # before opening: opening a device or a FIFO may itself do something
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)  # what was opened, should the path have been swapped since
        check(st)
        if cap is not None and st.st_size > cap:
            raise TooLarge(f"{st.st_size} bytes, more than {cap}")
        left = cap + 1 if cap is not None else None
        out = sys.stdout.buffer
        while left is None or left > 0:
            chunk = os.read(fd, CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                break
            out.write(chunk)
            if left is not None:
                left -= len(chunk)
        out.flush()
        if left == 0:
            raise TooLarge(f"{cap + 1} bytes or more (it grew while read), more than {cap}")
    finally:
        os.close(fd)


def write(path):
    try:
        check(os.stat(path))  # what a link there leads to, too: a write never goes into a FIFO or a device
    except FileNotFoundError:
        pass
    if os.path.lexists(path) and not os.access(path, os.W_OK):  # the rename below would replace what may not be written
        raise PermissionError(errno.EACCES, "Permission denied", path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    scratch = os.path.join(parent, f".{os.path.basename(path)}.quinebox-{os.getpid()}")
    try:
        with open(scratch, "xb") as f:
            while chunk := sys.stdin.buffer.read(CHUNK):
                f.write(chunk)
        if os.path.exists(path):
            os.chmod(scratch, os.stat(path).st_mode & 0o7777)
        os.rename(scratch, path)
    except BaseException:
        try:
            os.unlink(scratch)
        except OSError:
            pass
        raise


def info(path, st):
    """What `list` and `stat` say of one path (never opened)."""
    mode = st.st_mode
    kind = "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "symlink" if stat.S_ISLNK(mode) else "other"
    name = os.path.basename(path.rstrip("/")) or "/"
    return {"name": name, "path": path, "type": kind, "size": st.st_size, "mode": stat.S_IMODE(mode), "mtime": st.st_mtime}


def listing(path):
    found = []
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                found.append(info(os.path.join(path, entry.name), entry.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue  # gone since it was listed
    dump(sorted(found, key=lambda e: e["name"]))


def dump(value):
    sys.stdout.write(json.dumps(value))
    sys.stdout.flush()


def remove(path, recursive):
    if stat.S_ISDIR(os.lstat(path).st_mode):
        if not recursive:
            raise IsADirectoryError(errno.EISDIR, "Is a directory (remove it with recursive=True)")
        shutil.rmtree(path)  # by fds, never through a link (rmtree.avoids_symlink_attacks)
    else:
        os.unlink(path)


def mkdir(path, parents, exist_ok):
    try:
        if parents:
            os.makedirs(path)
        else:
            os.mkdir(path)
    except FileExistsError:
        if not (exist_ok and stat.S_ISDIR(os.stat(path).st_mode)):
            raise


def gettar(path, cap):
    """A tar of `path` (a file: one member, its name; a directory: its contents, by their paths in it) on stdout.
    `path` itself is reached as the kernel follows it; what lies beneath it is never followed."""
    top = os.stat(path)
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        if stat.S_ISDIR(top.st_mode):
            walk(tar, path, "", cap)
        else:
            check(top)
            add(tar, path, os.path.basename(path.rstrip("/")), cap, follow=True)


def walk(tar, root, rel, cap):
    with os.scandir(os.path.join(root, rel) if rel else root) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        inner = f"{rel}/{name}" if rel else name
        full = os.path.join(root, inner)
        try:
            mode = os.lstat(full).st_mode
        except FileNotFoundError:
            continue  # gone since it was listed
        if stat.S_ISDIR(mode):
            tar.addfile(tar.gettarinfo(full, inner))
            walk(tar, root, inner, cap)
        elif stat.S_ISLNK(mode):
            tar.addfile(tar.gettarinfo(full, inner))
        elif stat.S_ISREG(mode):
            add(tar, full, inner, cap, follow=False)
        # a FIFO, a socket or a device has no bytes to copy: left out


def add(tar, full, name, cap, follow):
    """One regular file, opened without blocking (and, beneath the top, without following a link), its size the one
    it had when opened: a file the box keeps growing ends there."""
    fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    with os.fdopen(fd, "rb") as f:
        check(os.fstat(fd))  # what was opened, should the path have been swapped since
        item = tar.gettarinfo(arcname=name, fileobj=f)
        if tar.offset + item.size + 3 * tarfile.BLOCKSIZE > cap:
            raise TooLarge(f"{tar.offset + item.size} bytes or more, more than {cap}")
        tar.addfile(item, f)


def puttar(path, cap, code):
    untar = types.ModuleType("untar")
    try:
        import lzma  # noqa: F401
    except ImportError:  # the guest's runtime has no _lzma: an xz archive is then one tarfile cannot read
        stub = types.ModuleType("lzma")
        setattr(stub, "LZMAError", type("LZMAError", (Exception,), {}))  # noqa: B010 what untar.py catches
        sys.modules["lzma"] = stub
    exec(compile(code, "untar.py", "exec"), untar.__dict__)
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the directory itself, as its links lead
    try:
        spool = f".quinebox-tar-{os.getpid()}-{os.urandom(4).hex()}"
        held = os.open(spool, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        os.unlink(spool, dir_fd=fd)  # at once, and read again through `held` only: no name of it for a box process to swap or make a FIFO
        try:
            with os.fdopen(held, "wb", closefd=False) as out:
                left = cap + 1
                while left > 0 and (chunk := sys.stdin.buffer.read(min(CHUNK, left))):
                    out.write(chunk)
                    left -= len(chunk)
            if left == 0:
                raise TooLarge(f"{cap + 1} bytes or more, more than {cap}")
            archive = f"/proc/self/fd/{held}"  # this very file, opened anew from the start (it has no name)
            no_link_in_the_way(archive, fd)
            untar.unpack(archive, f"/proc/self/fd/{fd}", max_members=MAX_MEMBERS, max_bytes=1 << 62)
        except (untar.Refused, untar.Unreadable) as exc:
            raise Refused(str(exc)) from None
        finally:
            os.close(held)
    finally:
        os.close(fd)


def no_link_in_the_way(archive, root):
    """No member goes through a link the box already has beneath the destination (`root`, an fd). untar.py opens
    each directory with O_NOFOLLOW, which holds on Linux; gVisor's openat follows a link when O_DIRECTORY is
    given too, so each member's directories are looked at (lstat) first. Malformed names are untar.py's to refuse."""
    seen = set()
    try:
        with tarfile.open(archive) as tar:
            names = tar.getnames()
    except (tarfile.TarError, EOFError, OSError):
        return  # untar.py says why it cannot read it
    for name in names:
        parts = [part for part in name.split("/") if part not in ("", ".")]
        for end in range(1, len(parts)):
            above = "/".join(parts[:end])
            if above in seen or ".." in parts or name.startswith("/"):
                continue
            seen.add(above)
            try:
                if stat.S_ISLNK(os.lstat(above, dir_fd=root).st_mode):
                    raise Refused(f"{name!r} goes through {above!r}, which is a symlink in the destination")
            except (FileNotFoundError, NotADirectoryError):
                break


def flag(word):
    return word == "1"


#: Each command: (how many arguments after PATH it takes, what it does with PATH and them).
COMMANDS = {
    "read": ((0, 1), lambda path, *a: read(path, int(a[0]) if a else None)),
    "write": ((0,), lambda path, *a: write(path)),
    "list": ((0,), lambda path, *a: listing(path)),
    "stat": ((0, 1), lambda path, *a: dump(info(path, os.stat(path) if a and flag(a[0]) else os.lstat(path)))),
    "remove": ((0, 1), lambda path, *a: remove(path, bool(a) and flag(a[0]))),
    "mkdir": ((2,), lambda path, *a: mkdir(path, flag(a[0]), flag(a[1]))),
    "gettar": ((1,), lambda path, *a: gettar(path, int(a[0]))),
    "puttar": ((2,), lambda path, *a: puttar(path, int(a[0]), a[1])),
}


def path_of(arg):
    """PATH as the host gave it: itself, or "hex:" and its bytes (a name no UTF-8 text spells, which an exec's argv
    cannot carry there), as the str os functions turn back into those bytes (surrogateescape)."""
    return os.fsdecode(bytes.fromhex(arg[4:])) if arg.startswith("hex:") else arg


def main(argv):
    command = COMMANDS.get(argv[1]) if len(argv) >= 3 else None
    cap = argv[3] if len(argv) > 3 and argv[1] in ("read", "gettar", "puttar") else "0"
    if command is None or len(argv) - 3 not in command[0] or not (cap.isascii() and cap.isdigit()):
        sys.stderr.write("usage: files.py read|write|list|stat|remove|mkdir|gettar|puttar PATH [ARGS...]\n")
        return OTHER
    argv = [*argv[:2], path_of(argv[2]), *argv[3:]]
    try:
        command[1](*argv[2:])
    except NotAFile as exc:
        sys.stderr.write(f"{exc}: {argv[2]}\n")
        return NOT_A_FILE
    except TooLarge as exc:
        sys.stderr.write(f"{exc}: {argv[2]}\n")
        return TOO_LARGE
    except Refused as exc:
        sys.stderr.write(f"{exc}: {argv[2]}\n")
        return REFUSED
    except OSError as exc:
        sys.stderr.write(f"{exc.strerror or exc}: {argv[2]}\n")
        return CODES.get(exc.errno or 0, OTHER)  # one without an errno is OTHER too
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
