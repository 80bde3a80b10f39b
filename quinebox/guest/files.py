"""A long-lived box's files, read and written from inside it: `files.py read PATH [CAP]` and `files.py write PATH`.

The host runs this as an exec (its source sent with `python -c`, so it is always the host's own version), as the
box's user, so the kernel decides what may be read or written, through
the box's own mounts and links, as for any command there. read: the file's bytes on stdout, at most CAP of
them; write: stdin into the file, its missing parent directories made, replaced whole (a reader never sees
half of it). Each failure is an exit status the host turns back into Python's own error (box/live/sandboxes.py),
its reason on stderr.

The box may have made PATH anything: only a regular file is opened, never blocking (a FIFO nobody writes
would hang the read; a device or a socket is not a file's bytes), and no more than CAP bytes are read (a file
the box keeps growing never ends). The host holds its own cap and deadline too: this only makes the refusal
quick and clear.

Runs inside untrusted boxes: stdlib only, small.
"""

import errno
import os
import stat
import sys

#: Exit statuses, one per error the host raises again.
NOT_FOUND, IS_A_DIRECTORY, NOT_PERMITTED, OTHER, NOT_A_DIRECTORY, NOT_A_FILE, TOO_LARGE = 2, 3, 4, 5, 6, 7, 8
CODES = {errno.ENOENT: NOT_FOUND, errno.EISDIR: IS_A_DIRECTORY, errno.EACCES: NOT_PERMITTED, errno.EPERM: NOT_PERMITTED,
         errno.EROFS: NOT_PERMITTED, errno.ENOTDIR: NOT_A_DIRECTORY}
CHUNK = 1 << 16
KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class NotAFile(Exception):
    """What is at the path is not a regular file (a FIFO, a socket, a device): the message says which."""


class TooLarge(Exception):
    """The file has more bytes than the caller's cap: the message starts with how many (or the cap + 1)."""


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


def main(argv):
    reading = len(argv) in (3, 4) and argv[1] == "read" and (len(argv) == 3 or argv[3].isdigit())
    if not reading and (len(argv) != 3 or argv[1] != "write"):
        sys.stderr.write("usage: files.py read PATH [CAP] | files.py write PATH\n")
        return OTHER
    try:
        if reading:
            read(argv[2], int(argv[3]) if len(argv) == 4 else None)
        else:
            write(argv[2])
    except NotAFile as exc:
        sys.stderr.write(f"{exc}: {argv[2]}\n")
        return NOT_A_FILE
    except TooLarge as exc:
        sys.stderr.write(f"{exc}: {argv[2]}\n")
        return TOO_LARGE
    except OSError as exc:
        sys.stderr.write(f"{exc.strerror or exc}: {argv[2]}\n")
        return CODES.get(exc.errno or 0, OTHER)  # one without an errno is OTHER too
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
