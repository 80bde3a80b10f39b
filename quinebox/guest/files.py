"""A long-lived box's files, read and written from inside it: `files.py read PATH` and `files.py write PATH`.

The host runs this as an exec, as the box's user, so the kernel decides what may be read or written, through
the box's own mounts and links, as for any command there. read: the file's bytes on stdout; write: stdin
into the file, its missing parent directories made, replaced whole (a reader never sees half of it). Each
failure is an exit status the host turns back into Python's own error (box/sandboxes.py), its reason on stderr.

Runs inside untrusted boxes: stdlib only, small.
"""

import errno
import os
import sys

#: Exit statuses, one per error the host raises again.
NOT_FOUND, IS_A_DIRECTORY, NOT_PERMITTED, OTHER, NOT_A_DIRECTORY = 2, 3, 4, 5, 6
CODES = {errno.ENOENT: NOT_FOUND, errno.EISDIR: IS_A_DIRECTORY, errno.EACCES: NOT_PERMITTED, errno.EPERM: NOT_PERMITTED,
         errno.EROFS: NOT_PERMITTED, errno.ENOTDIR: NOT_A_DIRECTORY}
CHUNK = 1 << 16


def read(path):
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


def write(path):
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if os.path.lexists(path) and not os.access(path, os.W_OK):  # the rename below would replace what may not be written
        raise PermissionError(errno.EACCES, "Permission denied", path)
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    scratch = os.path.join(parent, f".{os.path.basename(path)}.quinebox-{os.getpid()}")
    try:
        with open(scratch, "wb") as f:
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
    if len(argv) != 3 or argv[1] not in ("read", "write"):
        sys.stderr.write("usage: files.py read|write PATH\n")
        return OTHER
    try:
        (read if argv[1] == "read" else write)(argv[2])
    except OSError as exc:
        sys.stderr.write(f"{exc.strerror or exc}: {argv[2]}\n")
        return CODES.get(exc.errno, OTHER)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
