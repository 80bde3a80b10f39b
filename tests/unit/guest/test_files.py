"""The guest's files.py, run as the host runs it in a box (a process of its own), on what a box may plant.

Each case has a deadline: a read that opened a FIFO would wait for a writer for ever."""

import os
import socket
import subprocess
import sys
import time

import pytest

from quinebox.guest import files

FILES = os.path.join(os.path.dirname(files.__file__), "files.py")


def run(*args: str, input: bytes = b"") -> tuple[int, bytes, str]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, FILES, *args], input=input, capture_output=True, timeout=10)
    assert time.monotonic() - began < 5
    return done.returncode, done.stdout, done.stderr.decode()


@pytest.fixture
def planted(tmp_path):
    (tmp_path / "file").write_bytes(b"0123456789")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "sock"))
    os.symlink("/dev/zero", tmp_path / "zero")
    os.symlink("/dev/null", tmp_path / "null")
    os.symlink("fifo", tmp_path / "to-fifo")
    return tmp_path


@pytest.mark.parametrize(
    "name, cap, code, out, said",
    [
        ("file", None, 0, b"0123456789", ""),
        ("file", "10", 0, b"0123456789", ""),
        ("file", "9", files.TOO_LARGE, b"", "10 bytes, more than 9"),
        ("file", "0", files.TOO_LARGE, b"", "10 bytes, more than 0"),
        ("fifo", None, files.NOT_A_FILE, b"", "a FIFO, not a regular file"),
        ("to-fifo", "5", files.NOT_A_FILE, b"", "a FIFO, not a regular file"),
        ("sock", None, files.NOT_A_FILE, b"", "a socket, not a regular file"),
        ("zero", None, files.NOT_A_FILE, b"", "a character device, not a regular file"),
        ("null", "5", files.NOT_A_FILE, b"", "a character device, not a regular file"),
        ("dir", None, files.IS_A_DIRECTORY, b"", "Is a directory"),
        ("missing", None, files.NOT_FOUND, b"", "No such file"),
    ],
)
def test_read_takes_only_a_regular_file_and_no_more_than_its_cap(planted, name, cap, code, out, said):
    got = run("read", str(planted / name), *([cap] if cap else []))
    assert got[:2] == (code, out) and said in got[2], got
    assert got[2].count("\n") == (1 if code else 0)


def test_read_of_a_file_that_grows_stops_at_the_cap(tmp_path):
    """/proc/self/… is no use here; a file whose size says little and whose reads go on: a regular file being
    appended to by another process."""
    grow = tmp_path / "grow"
    grow.write_bytes(b"")
    writer = subprocess.Popen([sys.executable, "-c", f"import os\nf=open({str(grow)!r},'ab',0)\nwhile True: f.write(b'y'*65536)"])
    try:
        while grow.stat().st_size < 1 << 20:
            time.sleep(0.01)
        code, out, said = run("read", str(grow), str(64 << 20))
    finally:
        writer.kill()
        writer.wait()
    assert code in (0, files.TOO_LARGE) and len(out) <= (64 << 20) + 1
    code, out, said = run("read", str(grow), "1000")
    assert (code, out) == (files.TOO_LARGE, b"") and "more than 1000" in said


@pytest.mark.parametrize("name, said", [("fifo", "a FIFO"), ("to-fifo", "a FIFO"), ("sock", "a socket"), ("zero", "a character device"), ("dir", "Is a directory")])
def test_write_never_goes_into_a_fifo_a_socket_or_a_device(planted, name, said):
    code, _, err = run("write", str(planted / name), input=b"data")
    assert code in (files.NOT_A_FILE, files.IS_A_DIRECTORY) and said in err
    assert not [p for p in os.listdir(planted) if ".quinebox-" in p]


def test_write_replaces_a_file_whole_and_makes_its_parents(planted):
    assert run("write", str(planted / "file"), input=b"new")[0] == 0
    assert (planted / "file").read_bytes() == b"new"
    assert run("write", str(planted / "a" / "b" / "c"), input=b"deep")[0] == 0
    assert (planted / "a" / "b" / "c").read_bytes() == b"deep"


@pytest.mark.parametrize("argv", [[], ["read"], ["read", "/x", "-1"], ["read", "/x", "ten"], ["write"], ["cat", "/x"]])
def test_a_bad_call_is_one_line(argv):
    code, out, err = run(*argv)
    assert (code, out) == (files.OTHER, b"") and err.startswith("usage:") and err.count("\n") == 1
