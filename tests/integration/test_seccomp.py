"""Every denial the seccomp profile promises, probed with raw syscalls from inside a box.

Where an unconfined process would get a different answer (success, EFAULT,
EBADF), EPERM proves the filter did it; `syscall:` grants then show the same
probes getting through, so the denials are the profile's and not the kernel's.
"""

import json
import platform

import pytest
from backend_under_test import GVISOR

import quinebox

if platform.machine() != "x86_64":
    pytest.skip("the probe's syscall numbers are x86_64's", allow_module_level=True)

# name: (number, args)
PROBES = {
    "io_uring_setup": (425, (1, 0)),
    "io_uring_enter": (426, (-1, 0, 0, 0, 0, 0)),
    "io_uring_register": (427, (-1, 0, 0, 0)),
    "userfaultfd": (323, (1,)),  # UFFD_USER_MODE_ONLY: allowed unprivileged
    "keyctl": (250, (0, -3, 0)),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, (0, 0, 0, 0, 0)),
    "request_key": (249, (0, 0, 0, 0)),
    "bpf": (321, (0, 0, 0)),
    "perf_event_open": (298, (0, 0, -1, -1, 0)),
    "ptrace": (101, (0, 0, 0, 0)),  # PTRACE_TRACEME
    "process_vm_readv": (310, ("self", 0, 0, 0, 0, 0)),
    "process_vm_writev": (311, ("self", 0, 0, 0, 0, 0)),
    "unshare": (272, (0,)),
    "setns": (308, (-1, 0)),
    "mount": (165, (0, 0, 0, 0, 0)),
    "umount2": (166, (0, 0)),
    "pivot_root": (155, (0, 0)),
    "kexec_load": (246, (0, 0, 0, 0)),
    "kexec_file_load": (320, (-1, -1, 0, 0, 0)),
    "init_module": (175, (0, 0, 0)),
    "finit_module": (313, (-1, 0, 0)),
    "delete_module": (176, (0, 0)),
    "open_by_handle_at": (304, (-1, 0, 0)),
    "clock_settime": (227, (0, 0)),
    "settimeofday": (164, (0, 0)),
    "adjtimex": (159, (0,)),
    "clock_adjtime": (305, (0, 0)),
    "sethostname": (170, (0, 0)),
    "setdomainname": (171, (0, 0)),
    "socket_af_alg": (41, (38, 5, 0)),
    "socket_af_vsock": (41, (40, 1, 0)),
    "socket_af_packet": (41, (17, 3, 0)),
    "clone3": (435, (0, 0)),
}

PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for name, (nr, args) in json.loads(sys.argv[1]).items():
    args = [os.getpid() if a == "self" else a for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    out[name] = "ok" if r >= 0 else os.strerror(ctypes.get_errno())
print(json.dumps(out))
"""


#: On gVisor (GVISOR) the profile is loaded in front of gVisor's kernel: a call let through gets gVisor's own answer.
#: On bubblewrap the same profile, compiled to BPF by libseccomp, is loaded in front of the host's kernel, as on runc.


def probe(grants=()):
    result = quinebox.exec(["python3", "-c", PROBE, json.dumps(PROBES)], grants=grants)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def answers():
    return probe()


@pytest.mark.parametrize("name", [n for n in PROBES if n != "clone3"])
def test_denied_with_eperm(engine, answers, name):
    assert answers[name] == "Operation not permitted"


def test_clone3_answers_enosys(engine, answers):
    assert answers["clone3"] == "Function not implemented"


def test_syscall_grants_lift_exactly_those_denials(engine):
    relaxed = probe(grants=["syscall:unshare", "syscall:keyctl", "syscall:ptrace", "syscall:clone3"])
    assert relaxed["unshare"] == "ok"  # unshare(0) succeeds: the EPERM before was the filter's
    assert relaxed["keyctl"] == ("Permission denied" if GVISOR else "ok")  # gVisor's keyctl keeps its session keyring to itself
    assert relaxed["ptrace"] == "ok"
    # reached the kernel, which refused size 0; gVisor's (2022) has no clone3 and says so
    assert relaxed["clone3"] == ("Function not implemented" if GVISOR else "Invalid argument")
    assert relaxed["mount"] == "Operation not permitted"  # still denied: not granted


#: Each way a box could give a file a set-uid or set-gid bit (its mode argument, in a register seccomp reads), each
#: tried in /tmp beside the same call without the bit. Such a file, written into a `rw:` grant, would stay set-uid on
#: the host as one of the box's host ids (review 49, finding 6): systemd's RestrictSUIDSGID, in our profile.
SETID_PROBE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
os.chdir("/tmp")
out = {}
def attempt(name, f):
    try:
        f()
        out[name] = "ok"
    except OSError as e:
        out[name] = os.strerror(e.errno)
def raw(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else ctypes.c_char_p(a) for a in args])
    if r < 0:
        raise OSError(ctypes.get_errno(), "")
    if r >= 0 and nr in (2, 85, 257, 437):
        os.close(r)
open("f", "w").close()
attempt("chmod 0755", lambda: os.chmod("f", 0o755))
attempt("chmod 4755", lambda: os.chmod("f", 0o4755))
attempt("chmod 2755", lambda: os.chmod("f", 0o2755))
attempt("chmod(2) 6755", lambda: raw(90, b"f", 0o6755))
fd = os.open("f", os.O_RDONLY)
attempt("fchmod 4755", lambda: os.fchmod(fd, 0o4755))
attempt("fchmod 0700", lambda: os.fchmod(fd, 0o700))
attempt("open O_CREAT 0644", lambda: os.close(os.open("g", os.O_CREAT | os.O_WRONLY, 0o644)))
attempt("open O_CREAT 4755", lambda: os.close(os.open("h", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("open(2) O_CREAT 2755", lambda: raw(2, b"h2", os.O_CREAT | os.O_WRONLY, 0o2755))
attempt("open, no O_CREAT, a mode ignored", lambda: raw(257, -100, b"f", os.O_RDONLY, 0o4755))
attempt("O_TMPFILE 4755", lambda: os.close(os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4755)))
attempt("creat 4755", lambda: raw(85, b"c", 0o4755))
attempt("creat 0644", lambda: raw(85, b"c2", 0o644))
attempt("mkdir 2755", lambda: os.mkdir("d", 0o2755))
attempt("mkdir 0755", lambda: os.mkdir("e", 0o755))
attempt("mkfifo 4644", lambda: os.mkfifo("p", 0o4644))
attempt("mkfifo 0644", lambda: os.mkfifo("q", 0o644))
attempt("openat2", lambda: raw(437, -100, b"f", 0, 0))
out["modes"] = {n: oct(os.stat(n).st_mode) for n in sorted(os.listdir(".")) if n in ("f", "h", "h2", "c", "d", "p")}
print(json.dumps(out))
"""

SETID = {
    "chmod 0755": "ok", "chmod 4755": "Operation not permitted", "chmod 2755": "Operation not permitted", "chmod(2) 6755": "Operation not permitted",
    "fchmod 4755": "Operation not permitted", "fchmod 0700": "ok",
    "open O_CREAT 0644": "ok", "open O_CREAT 4755": "Operation not permitted", "open(2) O_CREAT 2755": "Operation not permitted",
    "open, no O_CREAT, a mode ignored": "ok", "O_TMPFILE 4755": "Operation not permitted",
    "creat 4755": "Operation not permitted", "creat 0644": "ok", "mkdir 2755": "Operation not permitted", "mkdir 0755": "ok",
    "mkfifo 4644": "Operation not permitted", "mkfifo 0644": "ok",
    # its mode is in memory seccomp cannot read: ENOSYS, so callers fall back to openat (gVisor's table lacks it: EPERM)
    "openat2": "Operation not permitted" if GVISOR else "Function not implemented",
    "modes": {"f": "0o100700"},  # nothing made with a set-id bit; f as the last allowed chmod left it
}


def test_a_box_that_writes_a_host_path_gives_no_set_uid_or_set_gid_bit_by_any_call(engine, tmp_path):
    """A set-id file on a `rw:` grant would let a host user who runs it become the box's user (policy.seccomp_profile)."""
    tmp_path.chmod(0o777)  # the box's user writes it
    result = quinebox.exec(["python3", "-c", SETID_PROBE], grants=[f"rw:{tmp_path}"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == SETID


def test_a_box_that_writes_no_host_path_may_give_set_id_bits(engine):
    """Its files are no one else's (its tmpfs, its layers, its world under the state dir): a package manager may install
    sudo or ssh-keysign into a writable root. The same calls, allowed whatever their mode."""
    result = quinebox.exec(["python3", "-c", SETID_PROBE])
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    allowed = dict.fromkeys([name for name in SETID if name not in ("modes", "openat2")], "ok")
    if GVISOR:  # gVisor's /tmp has no O_TMPFILE, whatever the mode
        allowed["O_TMPFILE 4755"] = "Operation not supported"
    assert {name: answer for name, answer in said.items() if name not in ("modes", "openat2")} == allowed, said
    assert said["openat2"] == SETID["openat2"]  # its mode is still out of seccomp's reach
    assert said["modes"]["h"] == said["modes"]["c"] == "0o104755", said["modes"]  # made set-uid (mkdir and mknod drop it themselves)
