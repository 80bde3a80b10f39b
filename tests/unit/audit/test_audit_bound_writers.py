"""The audit log appended by writers that file modes bind, as a plain user's are (root ignores them): sealing a
segment never refuses another writer, so no record is lost; and a write the kernel refuses says its real cause.

As root the writers run without capabilities (setpriv), so the kernel checks modes for them as it does for a
plain user; in CI's rootless pass they are a plain user's already."""

import os
import stat
import subprocess
import sys
from pathlib import Path

from test_audit_log import WRITER

from quinebox.audit.log import AuditLog, verify

#: Runs a command with no capabilities at all: as root, modes bind it as they bind a plain user.
BOUND = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"] if os.geteuid() == 0 else []
#: One append in a process of its own; prints what it was told and exits 125 when it could not write.
APPEND = """
import sys
from pathlib import Path
from quinebox.audit.log import AuditLog
from quinebox.errors import QuineboxError
try:
    AuditLog(Path(sys.argv[1])).append("egress", "s1", host="example.com")
except QuineboxError as exc:
    print(exc)
    sys.exit(125)
"""


def test_writers_bound_by_modes_sealing_at_every_record_lose_none(tmp_path):
    """Every record seals its segment, so a writer opens the log while another seals it hundreds of times: the seal
    made the segment read-only before moving it away, and a plain user's open of the log by its name was refused
    (EACCES) in that moment, losing the record (CI's rootless pass: two of eight writers died)."""
    where = str(tmp_path / "audit")
    env = {**os.environ, "QUINEBOX_AUDIT_SEGMENT": "1"}
    writers = [subprocess.Popen([*BOUND, sys.executable, "-c", WRITER, where, f"w{n}", "100"], env=env, stderr=subprocess.PIPE) for n in range(8)]
    died = [(w.wait(120), w.stderr.read().decode().strip().splitlines()[-1:]) for w in writers]
    assert [code for code, _ in died] == [0] * 8, died
    log = AuditLog(tmp_path / "audit")
    assert verify(log).line() == "intact: 800 record(s)"
    seen = sorted((r["session"], r["facts"]["index"]) for r in log.records())
    assert seen == sorted((f"w{n}", i) for n in range(8) for i in range(100))
    segments = list(log.segments.iterdir())
    assert len(segments) == 800 and {stat.S_IMODE(p.stat().st_mode) for p in segments} == {0o400}


def append(directory: Path, *wrap: str) -> subprocess.CompletedProcess:
    return subprocess.run([*wrap, sys.executable, "-c", APPEND, str(directory)], capture_output=True, text=True, timeout=60)


def test_a_write_the_kernel_refuses_names_the_file_and_asks_for_its_owner_or_mode_not_for_space(tmp_path):
    directory = tmp_path / "audit"
    AuditLog(directory).append("box_created", "s0")
    os.chmod(directory / "log.jsonl", 0o400)
    done = append(directory, *BOUND)
    said = done.stdout.strip()
    assert done.returncode == 125, done.stderr
    assert said.startswith("cannot write the audit log in the state dir ") and "free some space" not in said, said
    assert f": Permission denied ({directory / 'log.jsonl'}); it must be yours (uid {os.getuid()}) and writable by you: fix its owner or mode" in said, said


def test_a_full_disk_asks_for_space(tmp_path):
    """A real full filesystem: a tmpfs of 64 KiB, filled, mounted in a user and mount namespace of the test's own."""
    directory = tmp_path / "full"
    directory.mkdir()
    script = f"mount -t tmpfs -o size=64k tmpfs {directory} && (cat /dev/zero > {directory}/filler 2>/dev/null; exec {sys.executable} -c '{APPEND}' {directory}/audit)"
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    said = done.stdout.strip()
    assert done.returncode == 125, done.stderr
    assert said.startswith("cannot write the audit log in the state dir ") and said.endswith(": No space left on device; free some space there (`quinebox gc`, or remove old sessions/) and run again"), said
