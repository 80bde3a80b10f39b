"""A gVisor sandbox that dies is one line naming why, with the documented exit status: its panic log read, its reason mapped."""

import pytest

from quinebox.box.backends.oci.box import died
from quinebox.box.backends.oci.runtime import PANIC_LOG, sandbox_death

TRACE = "\ngoroutine 113 [running]:\npanic({0xe7f040, 0xc0000ca940})\n\truntime/panic.go:987 +0x3ba\n"


@pytest.mark.parametrize(
    "log, reason",
    [
        ("panic: unable to activate mm: creating stub process: resource temporarily unavailable" + TRACE,
         "unable to activate mm: creating stub process: resource temporarily unavailable"),
        ("W1202 18:14:14 some warning\nfatal error: out of memory\n" + TRACE, "out of memory"),
        ("panic: " + "x" * 1000, "x" * 300),
        ("runtime: failed to create new OS thread (have 39 already; errno=11)\nruntime: may need to increase max user processes (ulimit -u)\n"
         "fatal error: newosproc\n" + TRACE, "failed to create new OS thread (have 39 already; errno=11)"),
        ("goroutine 1 [running]:\n", None),
        ("", None),
        (b"panic: \xff\xfe bytes\n", "\ufffd\ufffd bytes"),
    ],
)
def test_the_panic_logs_first_reason(tmp_path, log, reason):
    (tmp_path / PANIC_LOG).write_bytes(log if isinstance(log, bytes) else log.encode())
    assert sandbox_death(str(tmp_path)) == reason


def test_no_panic_log_is_no_death(tmp_path):
    assert sandbox_death(str(tmp_path)) is None


CONFIG = {"linux": {"resources": {"pids": {"limit": 8704}}}}


@pytest.mark.parametrize(
    "reason, code, words",
    [
        ("unable to activate mm: creating stub process: resource temporarily unavailable", 137, "host refused it a resource"),
        ("error initializing first thread: resource temporarily unavailable", 137, "may number 8704 on the host"),
        ("fatal error: cannot allocate memory", 137, "the box was killed"),
        ("failed to create new OS thread (have 39 already; errno=11)", 137, "host refused it a resource"),
        ("trying to use inactive address space?", 137, "may number 8704 on the host"),  # seen in CI under the tasks limit
        ("runtime error: index out of range [3] with length 3", 125, "gVisor's sandbox died: runtime error: index out of range"),
    ],
)
def test_a_death_is_one_line_and_its_exit_status(reason, code, words):
    status, line = died(reason, CONFIG)
    assert status == code and words in line and "\n" not in line and line.startswith("gVisor's sandbox died: ")
