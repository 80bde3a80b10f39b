"""A Sandbox's files beyond read and write, on the default backend: listdir, stat, remove, mkdir, tars and
directories in and out; and exec's output cap.

Each is an exec of the guest's files.py in the box as its user (box/live/box_files.py): exact bytes and modes
come back, Python's own errors say what the box refused, nothing the box planted (a FIFO, a link out, a tar
member with ../) hangs the host or is followed, and the caps hold.
"""

import io
import os
import shutil
import tarfile
import time

import pytest

import quinebox
from quinebox import FileInfo, FileTooLargeError, QuineboxError
from quinebox.box.live import box_files


@pytest.fixture(scope="module")
def sb():
    with quinebox.Sandbox(grants=["pids:128"]) as box:
        yield box


@pytest.fixture
def here(sb):
    """A fresh directory of the box's for one test."""
    path = f"/world/t{os.urandom(3).hex()}"
    sb.mkdir(path)
    yield path
    sb.remove(path, recursive=True)


def tar_of(*members: tuple[str, bytes | None, str | None]) -> io.BytesIO:
    """A tar made here: (name, bytes, None) a file, (name, None, target) a symlink, (name, None, None) a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data, link in members:
            item = tarfile.TarInfo(name)
            if link is not None:
                item.type, item.linkname = tarfile.SYMTYPE, link
                tar.addfile(item)
            elif data is None:
                item.type, item.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(item)
            else:
                item.size, item.mode = len(data), 0o640
                tar.addfile(item, io.BytesIO(data))
    out.seek(0)
    return out


def test_listdir_and_stat_say_what_each_path_is_links_as_links(sb, here):
    sb.write_file(f"{here}/a.bin", b"\x00\x01\xff" * 7)
    sb.mkdir(f"{here}/sub")
    assert sb.exec(["sh", "-c", f"cd {here} && chmod 751 a.bin && ln -s /etc/passwd out && mkfifo fifo"]).returncode == 0
    found = {info.name: info for info in sb.listdir(here)}
    assert sorted(found) == ["a.bin", "fifo", "out", "sub"]
    assert found["a.bin"] == FileInfo("a.bin", f"{here}/a.bin", "file", 21, 0o751, found["a.bin"].mtime)
    assert (found["sub"].type, found["out"].type, found["fifo"].type) == ("dir", "symlink", "other")
    assert found["out"].size == len("/etc/passwd")  # the link itself, never what it leads to
    assert abs(found["a.bin"].mtime - time.time()) < 120
    assert sb.stat(f"{here}/out").type == "symlink"
    assert sb.stat(f"{here}/out", follow_symlinks=True).type == "file"
    assert sb.stat(f"{here}/fifo").type == "other"  # looked at, never opened: no hang
    assert [i.name for i in sb.listdir(f"{here}/sub")] == []
    relative = sb.listdir(".")
    assert here.rsplit("/", 1)[1] in [i.name for i in relative] and relative[0].path.startswith("/world/")


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda sb, d: sb.stat(f"{d}/missing"), FileNotFoundError),
        (lambda sb, d: sb.listdir(f"{d}/missing"), FileNotFoundError),
        (lambda sb, d: sb.listdir(f"{d}/file"), NotADirectoryError),
        (lambda sb, d: sb.remove(f"{d}/dir"), IsADirectoryError),
        (lambda sb, d: sb.remove(f"{d}/missing"), FileNotFoundError),
        (lambda sb, d: sb.remove("/etc/passwd"), PermissionError),
        (lambda sb, d: sb.mkdir(f"{d}/dir", exist_ok=False), FileExistsError),
        (lambda sb, d: sb.mkdir(f"{d}/file"), FileExistsError),
        (lambda sb, d: sb.mkdir(f"{d}/no/such", parents=False), FileNotFoundError),
        (lambda sb, d: sb.mkdir(f"{d}/file/under"), NotADirectoryError),
        (lambda sb, d: sb.mkdir("/etc/quinebox-test"), PermissionError),
        (lambda sb, d: sb.get_tar(f"{d}/missing", io.BytesIO()), FileNotFoundError),
        (lambda sb, d: sb.get_tar(f"{d}/fifo", io.BytesIO()), shutil.SpecialFileError),
        (lambda sb, d: sb.put_tar("/etc/quinebox-test", tar_of(("x", b"x", None))), PermissionError),
    ],
    ids=["stat-missing", "listdir-missing", "listdir-file", "remove-dir", "remove-missing", "remove-readonly", "mkdir-exists",
         "mkdir-on-file", "mkdir-no-parents", "mkdir-under-file", "mkdir-readonly", "get-tar-missing", "get-tar-fifo", "put-tar-readonly"],
)
def test_errors_are_pythons_own(sb, here, call, error):
    sb.write_file(f"{here}/file", b"x")
    sb.mkdir(f"{here}/dir/inner")
    assert sb.exec(["mkfifo", f"{here}/fifo"]).returncode == 0
    began = time.monotonic()
    with pytest.raises(error):
        call(sb, here)
    assert time.monotonic() - began < 10
    assert sb.exec(["true"]).returncode == 0


def test_remove_recursive_never_follows_a_link_out(sb, here):
    sb.write_file(f"{here}/keep/precious", b"mine")
    sb.write_file(f"{here}/doomed/a/b", b"x")
    assert sb.exec(["sh", "-c", f"ln -s {here}/keep {here}/doomed/link && ln -s {here}/keep/precious {here}/doomed/a/file"]).returncode == 0
    sb.remove(f"{here}/doomed", recursive=True)
    assert [i.name for i in sb.listdir(here)] == ["keep"]
    assert sb.read_file(f"{here}/keep/precious") == b"mine"
    sb.remove(f"{here}/keep/precious")
    assert sb.listdir(f"{here}/keep") == []


def test_tar_round_trip_keeps_bytes_modes_and_links(sb, here):
    data = bytes(range(256)) * 300
    sb.write_file(f"{here}/src/deep/blob", data)
    assert sb.exec(["sh", "-c", f"cd {here}/src && chmod 700 deep/blob && ln -s deep/blob rel && ln -s /etc/passwd abs && mkfifo fifo"]).returncode == 0
    out = io.BytesIO()
    sb.get_tar(f"{here}/src", out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        members = {m.name: m for m in tar}
        assert sorted(members) == ["abs", "deep", "deep/blob", "rel"]  # the FIFO left out
        assert members["abs"].issym() and members["abs"].linkname == "/etc/passwd"  # a link, never its target's bytes
        assert tar.extractfile(members["deep/blob"]).read() == data
    one = io.BytesIO()
    sb.get_tar(f"{here}/src/deep/blob", one)
    one.seek(0)
    with tarfile.open(fileobj=one) as tar:
        assert [m.name for m in tar] == ["blob"]
    out.seek(0)
    with pytest.raises(QuineboxError, match="abs"):  # an absolute link is refused going in, whole: nothing written
        sb.put_tar(f"{here}/copy", out)
    assert sb.listdir(f"{here}/copy") == []
    sb.remove(f"{here}/src/abs")
    again = io.BytesIO()
    sb.get_tar(f"{here}/src", again)
    again.seek(0)
    sb.put_tar(f"{here}/copy", again)
    assert sb.read_file(f"{here}/copy/deep/blob") == data
    assert sb.stat(f"{here}/copy/deep/blob").mode == 0o700
    assert sb.stat(f"{here}/copy/rel").type == "symlink"
    assert sb.read_file(f"{here}/copy/rel") == data


@pytest.mark.parametrize(
    "members, words",
    [
        ([("ok", b"fine", None), ("../escaped", b"evil", None)], "'..'"),
        ([("/abs-escaped", b"evil", None)], "absolute"),
        ([("out", None, "/tmp"), ("out/escaped", b"evil", None)], "out"),
        ([("up", None, "../../tmp"), ("z", b"x", None)], "outside"),
    ],
    ids=["dotdot", "absolute-name", "through-absolute-link", "link-outward"],
)
def test_a_tar_whose_member_would_escape_is_refused_and_nothing_is_written(sb, here, members, words):
    with pytest.raises(QuineboxError, match=words):
        sb.put_tar(f"{here}/dest", tar_of(*members))
    assert sb.listdir(f"{here}/dest") == []
    assert sb.exec(["sh", "-c", f"ls {here}/escaped /abs-escaped /tmp/escaped 2>/dev/null"]).stdout == b""


def test_a_tar_through_a_link_the_box_planted_in_the_destination_is_refused(sb, here):
    assert sb.exec(["sh", "-c", f"mkdir -p {here}/dest && ln -s /tmp {here}/dest/sub"]).returncode == 0
    with pytest.raises(QuineboxError, match="sub"):
        sb.put_tar(f"{here}/dest", tar_of(("sub/planted", b"evil", None)))
    assert sb.exec(["sh", "-c", "test -e /tmp/planted"]).returncode == 1


def test_the_caps_hold_at_once_and_the_box_stays_up(sb, here):
    sb.write_file(f"{here}/big", b"x" * 50_000)
    began = time.monotonic()
    with pytest.raises(FileTooLargeError):
        sb.get_tar(here, io.BytesIO(), max_bytes=20_000)
    with pytest.raises(FileTooLargeError):
        sb.put_tar(f"{here}/in", tar_of(("f", b"y" * 50_000, None)), max_bytes=20_000)
    assert sb.listdir(f"{here}/in") == []
    assert sb.exec(["sh", "-c", f"cd {here} && for i in $(seq 200); do : > name-that-is-rather-long-$i; done"]).returncode == 0
    with pytest.raises(FileTooLargeError):
        sb.listdir(here, max_bytes=4096)
    assert time.monotonic() - began < 10
    assert len(sb.listdir(here)) == 202


def test_put_dir_and_get_dir_copy_a_tree_exactly(sb, here, tmp_path):
    local = tmp_path / "local"
    (local / "a" / "b").mkdir(parents=True)
    (local / "a" / "b" / "data").write_bytes(b"\x00tree\xff")
    (local / "top.txt").write_bytes(b"top\n")
    os.chmod(local / "top.txt", 0o751)
    os.symlink("a/b/data", local / "link")
    os.mkfifo(local / "fifo")  # left out, as the box's are
    sb.put_dir(local, f"{here}/tree")
    assert sorted(i.name for i in sb.listdir(f"{here}/tree")) == ["a", "link", "top.txt"]
    assert sb.read_file(f"{here}/tree/a/b/data") == b"\x00tree\xff"
    back = tmp_path / "back"
    sb.get_dir(f"{here}/tree", back)
    assert (back / "a" / "b" / "data").read_bytes() == b"\x00tree\xff"
    assert (back / "top.txt").read_bytes() == b"top\n" and oct(os.stat(back / "top.txt").st_mode & 0o777) == oct(0o751 & 0o755)
    assert os.readlink(back / "link") == "a/b/data"
    with pytest.raises(NotADirectoryError):
        sb.put_dir(local / "top.txt", here)


def test_get_dir_unpacks_the_boxs_tar_as_untrusted(sb, here, tmp_path):
    """The box's tar is its own work: a link it planted that points out of the destination is refused here."""
    assert sb.exec(["sh", "-c", f"mkdir -p {here}/out && echo ok > {here}/out/ok && ln -s ../../../../../../{tmp_path}/victim {here}/out/evil"]).returncode == 0
    with pytest.raises(QuineboxError, match="evil"):
        sb.get_dir(f"{here}/out", tmp_path / "got")
    assert not os.path.lexists(tmp_path / "got" / "evil") and not os.path.lexists(tmp_path / "victim")


def test_exec_output_past_its_cap_is_dropped_and_the_command_goes_on(sb):
    result = sb.exec(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo done >&2"], max_output=1000)
    assert result.returncode == 0 and result.truncated
    assert result.stdout == b"a" * 1000 and result.stderr == b"done\n"
    assert result.args == ("sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo done >&2")
    whole = sb.exec(["sh", "-c", "head -c 300000 /dev/zero"])
    assert len(whole.stdout) == 300000 and not whole.truncated


class Breaks(io.RawIOBase):
    """A caller's stream that gives `data`'s first `upto` bytes, then fails as a dropped connection does."""

    def __init__(self, data: bytes, upto: int):
        self.data, self.upto, self.pos = data, upto, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.pos >= self.upto:
            raise ConnectionResetError(104, "peer reset")
        chunk = self.data[self.pos : min(self.pos + 512, self.upto)]
        self.pos += len(chunk)
        return chunk


def test_put_tar_raises_the_callers_stream_error_and_unpacks_nothing(sb, here):
    """A stream that breaks after a whole member (a tar cut at a header's boundary reads as complete) is the
    caller's error, raised; the exec is killed before it sees an end, so not even the first member is written."""
    whole = tar_of(("f0", b"0" * 1000, None), ("f1", b"1" * 1000, None), ("f2", b"2" * 1000, None)).getvalue()
    sb.mkdir(f"{here}/up")
    with pytest.raises(ConnectionResetError):
        sb.put_tar(f"{here}/up", Breaks(whole, 1536))  # the header and two blocks of f0
    assert sb.listdir(f"{here}/up") == []
    sb.put_tar(f"{here}/up", io.BytesIO(whole))
    assert [i.name for i in sb.listdir(f"{here}/up")] == ["f0", "f1", "f2"]


def answering(sb, said: bytes) -> box_files.Via:
    """The box as box_files reaches it, but each exec prints `said` in files.py's stead: what a box process that
    writes into files.py's stdout (rootless runc, gVisor) makes the host read."""
    octal = "".join(f"\\{byte:03o}" for byte in said)
    return box_files.Via(sb.target, lambda argv, **streams: sb.Popen(["printf", octal], **streams))


@pytest.mark.parametrize(
    "said, words",
    [
        (b"[]x", "not JSON"),
        (b"\xff", "not JSON"),
        (b'{"a": 1}', "not a list"),
        (b"[1]", "not an object"),
        (b'[{"name": "n", "path": "/n", "type": "file", "size": 1, "mode": 420}]', "not an object"),
        (b'[{"name": "n", "path": "/n", "type": "file", "size": 1, "mode": 420, "mtime": 1.0, "more": 1}]', "not an object"),
        (b'[{"name": "n", "path": "/n", "type": "file", "size": "x", "mode": 420, "mtime": 1.0}]', "size is 'x'"),
        (b'[{"name": "n", "path": "/n", "type": "file", "size": true, "mode": 420, "mtime": 1.0}]', "size is True"),
        (b'[{"name": 1, "path": "/n", "type": "file", "size": 1, "mode": 420, "mtime": 1.0}]', "name is 1"),
        (b'[{"name": "n", "path": "/n", "type": "fifo", "size": 1, "mode": 420, "mtime": 1.0}]', "type is 'fifo'"),
        (b'[{"name": "n", "path": "/n", "type": "file", "size": 1, "mode": 420, "mtime": "now"}]', "mtime is 'now'"),
    ],
    ids=["junk-after", "not-utf8", "object", "not-objects", "key-missing", "key-more", "size-str", "size-bool", "name-int", "type-unknown", "mtime-str"],
)
def test_a_malformed_listing_is_quineboxerror_naming_what_was_wrong(sb, said, words):
    with pytest.raises(QuineboxError, match=words):
        box_files.listdir(answering(sb, said), "/world")
    entry = said[1:-1] if said.startswith(b"[{") else said
    with pytest.raises(QuineboxError, match=words.replace("not a list", "not an object")):
        box_files.stat(answering(sb, entry), "/world")
    good = b'{"name": "n", "path": "/n", "type": "file", "size": 1, "mode": 420, "mtime": 1}'
    assert box_files.listdir(answering(sb, b"[" + good + b"]"), "/world") == [FileInfo("n", "/n", "file", 1, 0o644, 1)]


def test_a_name_of_bytes_no_text_spells_goes_back_into_every_call(sb, here):
    """listdir gives b'a\\xff' as 'a\\udcff' (surrogateescape); that str reaches the very file again."""
    assert sb.exec(["sh", "-c", f"printf hi > \"{here}/$(printf 'a\\377')\""]).returncode == 0
    (entry,) = sb.listdir(here)
    assert entry.name == os.fsdecode(b"a\xff") == "a\udcff"
    assert sb.read_file(entry.path) == b"hi"
    assert sb.stat(entry.path).size == 2
    sb.write_file(entry.path, b"again")
    assert sb.read_file(f"{here}/a\udcff") == b"again"
    sb.remove(entry.path)
    assert sb.listdir(here) == []


def test_stat_of_a_long_path_under_path_max(sb, here):
    """16 components of 120 é (3.9 KB; each é escaped in JSON as 6 bytes, 12 KB): stat answers, as the kernel does."""
    deep = here + "".join("/" + "\u00e9" * 120 for _ in range(16))
    sb.mkdir(deep)
    info = sb.stat(deep)
    assert (info.path, info.type, info.name) == (deep, "dir", "\u00e9" * 120)
    endless = box_files.Via(sb.target, lambda argv, **streams: sb.Popen(["head", "-c", "70000", "/dev/zero"], **streams))
    with pytest.raises(QuineboxError, match="more than 65536 bytes for stat") as raised:
        box_files.stat(endless, deep)
    assert not isinstance(raised.value, FileTooLargeError)  # whose hint is read_file's max_bytes, which stat has not


class Held(io.RawIOBase):
    """A caller's stream that gives `data`'s first block, calls `between()` once, then gives the rest."""

    def __init__(self, data: bytes, between):
        self.data, self.between, self.pos = data, between, 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.pos == 512:
            self.between()
        chunk = self.data[self.pos : self.pos + 512]
        self.pos += len(chunk)
        return chunk


def test_put_tar_spool_has_no_name_a_box_process_could_swap(sb, here):
    """A box process that renames its own tar over put_tar's spool, while the caller's stream is still coming, is
    never unpacked: the spool's name is gone at once, and it is read again through its fd only."""
    sb.mkdir(f"{here}/dest")
    sb.put_tar(f"{here}/evil", tar_of(("planted", b"the box's", None)))
    assert sb.exec(["tar", "-cf", f"{here}/evil.tar", "-C", f"{here}/evil", "planted"]).returncode == 0
    watcher = sb.Popen(["sh", "-c", f'while :; do for f in {here}/dest/.quinebox-tar-*; do [ -f "$f" ] && mv {here}/evil.tar "$f" && touch {here}/swapped && exit 0; done; done'])

    def between() -> None:  # once files.py holds its spool (as one of its fds shows), and if the spool has a name, the watcher swaps it
        while sb.exec(["sh", "-c", "ls -l /proc/[0-9]*/fd/ 2>/dev/null | grep -q quinebox-tar-"]).returncode != 0:
            time.sleep(0.05)
        named = sb.exec(["sh", "-c", f"ls -A {here}/dest"]).stdout
        while named and sb.exec(["test", "-e", f"{here}/swapped"]).returncode != 0:
            time.sleep(0.05)

    try:
        sb.put_tar(f"{here}/dest", Held(tar_of(("mine", b"the caller's", None)).getvalue(), between))
    finally:
        watcher.kill()
        watcher.wait(10)
    names = [i.name for i in sb.listdir(f"{here}/dest")]
    assert "mine" in names and "planted" not in names, names  # (the watcher may catch the name's instant and leave its tar there)
    assert sb.read_file(f"{here}/dest/mine") == b"the caller's"


def test_put_dir_takes_the_cap_its_refusal_names(sb, here, tmp_path):
    (tmp_path / "big").write_bytes(b"z" * 50_000)
    with pytest.raises(FileTooLargeError, match="max_bytes=N"):
        sb.put_dir(tmp_path, f"{here}/capped", max_bytes=20_000)
    sb.put_dir(tmp_path, f"{here}/whole", max_bytes=100_000)
    assert sb.read_file(f"{here}/whole/big") == b"z" * 50_000
