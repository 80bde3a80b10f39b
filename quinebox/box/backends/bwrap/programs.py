"""A bwrap box's seccomp program (policy.compile_seccomp's BPF), compiled once and kept: in this process, and in the
state dir for the processes after it.

Compiling costs a box that compiles it ~10 ms of CPU, and the import of pyseccomp before it two `ldconfig -p`
processes (ctypes finds libseccomp so): every cold command (`quinebox exec` with no server, the first call, which
starts one, a program's first `quinebox.exec`) paid both, for one of a few programs (a box's profile is its grants'
syscalls, narrowed to its own ids). Kept programs live in `seccomp/` in the state dir, a file each, named by the
SHA-256 of everything the program is made of:

- the profile, as canonical JSON (its architectures, default action and rules);
- the machine (`uname -m`: a state dir may be shared by hosts of two architectures);
- this module's and policy.py's own files (size and mtime: a quinebox whose compiler changed compiles anew);
- the dynamic linker's cache (/etc/ld.so.cache, size and mtime): installing or upgrading libseccomp runs ldconfig,
  so a libseccomp that knows more syscall names compiles the profile again rather than keep an older program.

A kept program is read only from a regular file of this user's that no one else may write, never through a link
(state.open_private), and only if it is whole (a non-empty run of 8-byte BPF instructions); anything else is compiled
again and written anew (a temporary file renamed into place, so no reader sees half of one). Failing to keep one
never fails a box: it is compiled as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

from quinebox.box.backends.bwrap import policy
from quinebox.state import open_private, state_root

#: One BPF instruction (struct sock_filter): a kept program is a whole number of them.
_INSTRUCTION = 8
#: Whatever, changed, must compile a kept program again (its size and mtime go into the name).
_INPUTS = (policy.__file__, __file__, "/etc/ld.so.cache")

_programs: dict[str, bytes] = {}
_compiling = threading.Lock()


def seccomp_program(profile: dict[str, Any], own_ids: tuple[int, int] | None = None) -> bytes:
    """policy.compile_seccomp's program for `profile`, compiled once for each profile (keyed by its canonical JSON) and
    kept. With `own_ids` (BwrapBox.own_ids), its chown calls are allowed only to them (policy.chown_to_own_ids): the
    profile the box is said to hold stays runc's, this is how bwrap's one-id user namespace answers as runc's does."""
    if own_ids is not None:
        profile = policy.chown_to_own_ids(profile, *own_ids)
    key = json.dumps(profile, sort_keys=True, separators=(",", ":"))
    with _compiling:
        if key not in _programs:
            path = _kept_path(key)
            program = _read(path) if path else None
            if program is None:
                program = policy.compile_seccomp(profile)
                if path:
                    _keep(path, program)
            _programs[key] = program
        return _programs[key]


def _kept_path(key: str) -> str | None:
    """Where the program for `key` is kept in the state dir, or None when there is no state dir to keep it in."""
    digest = hashlib.sha256(key.encode())
    digest.update(os.uname().machine.encode())
    for path in _INPUTS:
        try:
            info = os.stat(path)
            digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode())
        except OSError:
            digest.update(f"{path}:none".encode())
    try:
        return os.path.join(state_root(), "seccomp", digest.hexdigest() + ".bpf")
    except Exception:  # noqa: BLE001 (a state dir refused is said by the box's own start, not here)
        return None


def _read(path: str) -> bytes | None:
    try:
        fd = open_private(path, os.O_RDONLY)
    except Exception:  # noqa: BLE001 (none kept, or a link or another's file there: compiled, and kept anew)
        return None
    with os.fdopen(fd, "rb") as kept:
        program = kept.read()
    return program if program and len(program) % _INSTRUCTION == 0 else None


def _keep(path: str, program: bytes) -> None:
    directory = os.path.dirname(path)
    temporary = f"{path}.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "wb") as kept:
            kept.write(program)
        os.replace(temporary, path)  # a link planted at `path` is replaced, never written through
    except Exception:  # noqa: BLE001 (a full or read-only state dir: the program was compiled, the box goes on)
        try:
            os.unlink(temporary)
        except OSError:
            pass
