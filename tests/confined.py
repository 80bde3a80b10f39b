"""Run a command confined the ways a sandboxed agent confines itself, for the tests of what quinebox serves such a one.

    python tests/confined.py landlock CMD...   NoNewPrivs, then Landlock: no write anywhere (reads and execs allowed),
                                               as an agent CLI jails itself; a process that is not root must set
                                               NoNewPrivs before landlock_restrict_self(2), so every such one has it
    python tests/confined.py nnp CMD...        NoNewPrivs alone (`setpriv --no-new-privs`)

Stdlib only (ctypes for the Landlock calls, which Python does not name), so any interpreter runs it.
"""

import ctypes
import os
import struct
import sys

#: landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: one number on every architecture.
CREATE_RULESET, RESTRICT_SELF = 444, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
PR_SET_NO_NEW_PRIVS = 38
#: LANDLOCK_ACCESS_FS_*: write a file, remove a dir or file, make a char device, dir, file, socket, FIFO, block
#: device or symlink (ABI 1); truncate (ABI 3). Handled, and no rule allows any: no write anywhere.
WRITES_V1 = (1 << 1) | sum(1 << bit for bit in range(4, 13))
TRUNCATE = 1 << 14


def no_new_privs(libc) -> None:
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def landlock(libc) -> None:
    abi = libc.syscall(CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not enabled in this kernel")
    handled = WRITES_V1 | (TRUNCATE if abi >= 3 else 0)
    attr = ctypes.create_string_buffer(struct.pack("Q", handled))
    ruleset = libc.syscall(CREATE_RULESET, attr, 8, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    if libc.syscall(RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def main() -> None:
    how, argv = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    no_new_privs(libc)
    if how == "landlock":
        landlock(libc)
    elif how != "nnp":
        raise SystemExit(f"confined.py: landlock or nnp, not {how!r}")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
