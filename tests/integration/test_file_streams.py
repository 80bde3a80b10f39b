"""A box's stdin and stdout when they are the caller's regular files: read and written where the caller left them.

On gVisor the sentry would read and write a host file at an offset of its own, from 0: a box's output would
overwrite what the file held (`{ echo head; quinebox exec …; } > log`) and its input reread what the caller had
read. These run every runtime here, as a shell script would: the file offsets are the point.
"""

import os
import shlex
import subprocess

import pytest

from commands import QUINEBOX, qb

RUNTIMES = ["runc", "runsc"]


def shell(script: str, runtime: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, timeout=120, env={**os.environ, "QUINEBOX_BACKEND": "oci", "QUINEBOX_RUNTIME": runtime, "QB": QUINEBOX, **env})


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_stdout_and_stderr_on_one_file_keep_the_order_the_box_wrote_them(runtime, tmp_path):
    """`> log 2>&1`: 50 rounds of 60 KB to stdout, then a line to stderr, land in the box's order (on gVisor, where
    the file is written by a copier of ours, one copier for both)."""
    log = tmp_path / "log"
    script = "for i in $(seq 50); do head -c 60000 /dev/zero; echo \"err $i\" >&2; done"
    done = shell(f'"$QB" exec -- sh -c {shlex.quote(script)} > {log} 2>&1', runtime)
    assert done.returncode == 0, done.stderr
    assert log.read_bytes() == b"".join(b"\0" * 60000 + b"err %d\n" % i for i in range(1, 51))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_output_to_a_file_goes_after_what_it_holds(runtime, tmp_path):
    log = tmp_path / "log"
    done = shell(f'{{ echo head; "$QB" exec -- sh -c "echo out; echo err >&2; exit 3"; echo "rc=$?"; }} > {log} 2>&1', runtime)
    assert done.returncode == 0, done.stderr
    assert log.read_bytes() == b"head\nout\nerr\nrc=3\n"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_input_from_a_file_starts_where_the_caller_stopped_reading(runtime, tmp_path):
    material = tmp_path / "material"
    material.write_bytes(b"one\ntwo\nthree\n")
    done = shell(f'{{ read first; "$QB" exec -- cat; }} < {material}', runtime)
    assert (done.returncode, done.stdout) == (0, b"two\nthree\n"), done.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_an_exec_into_a_lasting_box_writes_after_what_the_file_holds(runtime, tmp_path):
    made = shell('"$QB" box create --ttl 5m', runtime)
    assert made.returncode == 0, made.stderr
    box = made.stdout.decode().strip()
    try:
        log = tmp_path / "log"
        done = shell(f'{{ echo head; "$QB" exec --in {box} -- echo X; }} > {log}', runtime)
        assert done.returncode == 0, done.stderr
        assert log.read_bytes() == b"head\nX\n"
    finally:
        qb("box", "rm", box)
