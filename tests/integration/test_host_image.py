"""`--image host` on the OCI runtime: the developer's own tools, read-only, and nothing of anyone's data.

Each box is a real one on this machine's root; what it shows is asked of the box's own kernel view (its mount
table, what its processes can open), never of the config we wrote. Run on runc in the main pass and on gVisor in
its own (scripts/test.sh); listings are Python's, as this runsc refuses coreutils' statx. bubblewrap refuses a host
box by design (its hidden view needs noexec tmpfs mounts of bounded inodes, which bwrap 0.8 cannot make): each way
of asking one of it is refused in one line, nothing started (the last test); in the bwrap pass, that test is this
file's answer and the others, which ask for the box bwrap refuses, are deselected (tests/conftest.py).
"""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from commands import QUINEBOX, ROOTLESS, qb, scripts

#: Host directories that a host's root holds here and that a box of the host shows empty.
HIDDEN = [d for d in ("/home", "/root", "/var", "/run", "/srv", "/mnt", "/media", "/boot", "/work") if os.path.isdir(d)]

PROBE = r"""
import json, os, sys
def listing(d):
    try:
        return sorted(os.listdir(d))
    except PermissionError:
        return "refused"
mountinfo = [line.split() for line in open("/proc/self/mountinfo")]
mounts = {fields[4]: fields[fields.index("-") + 1] for fields in mountinfo}
options = {fields[4]: fields[5].split(",") for fields in mountinfo}
dirs = json.loads(sys.argv[1])
print(json.dumps({
    "listing": {d: listing(d) for d in dirs},
    "fs": {d: mounts.get(d) for d in dirs},
    "shadow": open("/etc/shadow", "rb").read().decode(),
    "root_fs": mounts.get("/"),
    "root_ro": "ro" in options.get("/", []),
    "uid": os.getuid(),
    "dockerd": os.access(sys.argv[2], os.X_OK),
    "cwd": os.getcwd(),
}))
"""


def probe(*args: str, cwd=None) -> dict:
    dockerd = shutil.which("dockerd")
    assert dockerd, "the engine is installed here (setup.sh): its dockerd is the host tool the box must see"
    done = qb("exec", "--image", "host", *args, "--", "python3", "-c", PROBE, json.dumps(HIDDEN), dockerd, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_hosts_tools_are_there_and_its_data_is_not():
    assert HIDDEN and os.path.getsize("/etc/shadow") > 0
    seen = probe()
    assert seen["dockerd"] is True  # a host tool the agent image does not have
    assert qb("exec", "--", "test", "-e", shutil.which("dockerd")).returncode == 1
    for directory in HIDDEN:
        assert seen["fs"][directory] == "tmpfs", directory
        own = ["quinebox"] if directory == "/run" else []  # the box's own socket to the host, and nothing else
        assert seen["listing"][directory] in (own, "refused"), (directory, seen["listing"][directory])
    assert seen["shadow"] == ""  # the host's is not empty; the box's user could open it, and it holds nothing
    gvisor = os.environ.get("QUINEBOX_RUNTIME") == "runsc"  # its gofer serves the same overlay to the sandbox
    if ROOTLESS:  # an empty skeleton of the user's, read-only, the host's directories bound into it (boxroot.py)
        assert seen["root_ro"] and seen["uid"] == 0, seen
    else:
        assert seen["root_fs"] == ("9p" if gvisor else "overlay") and (gvisor or seen["root_ro"]) and seen["uid"] != 0, seen


@pytest.mark.parametrize("path", ["/usr/quinebox-write-test", "/etc/quinebox-write-test", "/home/quinebox-write-test", "/quinebox-write-test"])
def test_nothing_of_the_host_can_be_written(path):
    done = qb("exec", "--image", "host", "--", "sh", "-c", f"echo x > {path}")
    if ROOTLESS and os.path.dirname(path) in HIDDEN:  # the box's own empty tmpfs, its namespace's uid 0's: written in the box alone
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2 and (b"Read-only file system" in done.stderr or b"Permission denied" in done.stderr), done.stderr
    assert not os.path.exists(path)


def test_a_grant_inside_a_hidden_directory_shows_at_its_own_path_and_the_box_starts_there():
    parent = tempfile.mkdtemp(prefix="quinebox-host-", dir="/var/tmp")
    try:
        project, beside = os.path.join(parent, "project"), os.path.join(parent, "beside")
        os.makedirs(project)
        os.makedirs(beside)
        with open(os.path.join(project, "notes.txt"), "w") as f:
            f.write("mine\n")
        os.chmod(parent, 0o755)
        os.chmod(project, 0o777)
        done = qb("exec", "--image", "host", "-g", "rw:.", "--", "sh", "-c", f"pwd; cat notes.txt; echo made > out.txt; test -e {beside} || echo hidden", cwd=project)
        assert (done.returncode, done.stdout) == (0, f"{project}\nmine\nhidden\n".encode()), done.stderr
        with open(os.path.join(project, "out.txt")) as f:
            assert f.read() == "made\n"
    finally:
        shutil.rmtree(parent)


def test_the_box_has_its_own_tmp_and_no_network():
    marker = tempfile.NamedTemporaryFile(prefix="quinebox-host-marker-", dir="/tmp")
    with marker:
        done = qb("exec", "--image", "host", "--", "python3", "-c", f"""
import os, socket
print(os.path.exists({marker.name!r}))
print(sorted(name for _, name in socket.if_nameindex()))
""")
    assert (done.returncode, done.stdout) == (0, b"False\n['lo']\n"), done.stderr


def test_an_agent_runs_on_the_hosts_tools(tmp_path):
    dockerd = shutil.which("dockerd")
    model = scripts(tmp_path, look=[{"sh": f"test -x {dockerd} && echo tool >&4; wc -c < /etc/shadow >&4"}, {"exit": "success"}])
    done = qb("run", "-q", "--image", "host", "-m", f"script:{model / 'look.yaml'}", "look around")
    assert (done.returncode, done.stdout) == (0, b"tool\n0\n"), done.stderr


def test_a_child_may_be_of_the_host_only_if_its_parent_is():
    child = ["/.quinebox/bin/quinebox", "exec", "--image", "host", "--", "true"]
    refused = qb("exec", "-g", "spawn:1", "-g", "depth:1", "--", *child)
    assert refused.returncode == 125
    assert b"a child may use --image host only if its parent's box is one" in refused.stderr
    allowed = qb("exec", "--image", "host", "-g", "spawn:1", "-g", "depth:1", "--", *child)
    assert allowed.returncode == 0, allowed.stderr


@pytest.mark.root_only  # it asks the engine what it started
def test_the_docker_backend_refuses_it_in_one_line_and_starts_nothing(engine):
    before = {c.id for c in engine.containers.list(all=True)}
    done = subprocess.run([QUINEBOX, "exec", "--backend", "docker", "--image", "host", "--", "true"], capture_output=True, timeout=60)
    assert done.returncode == 125
    assert done.stderr.decode().count("\n") == 1 and "--image host needs an OCI runtime" in done.stderr.decode()
    assert {c.id for c in engine.containers.list(all=True)} <= before


def test_the_python_api_and_a_lasting_box_take_it_too():
    import quinebox

    result = quinebox.exec(["python3", "-c", "import os; print(os.listdir('/home'), open('/etc/shadow').read() == '')"], image="host")
    assert (result.returncode, result.stdout) == (0, b"[] True\n"), result.stderr
    made = qb("box", "create", "--image", "host", "--ttl", "5m")
    assert made.returncode == 0, made.stderr
    box = made.stdout.decode().strip()
    try:
        done = qb("exec", "--in", box, "--", "python3", "-c", "import os; print(os.listdir('/home'), os.access('/usr/bin/python3', os.X_OK))")
        assert (done.returncode, done.stdout) == (0, b"[] True\n"), done.stderr
    finally:
        qb("box", "rm", box)


#: Each way the CLI asks for a host box: an exec, an agent's run, a lasting box.
ASKED = {
    "exec": ["exec", "--image", "host", "--", "true"],
    "run": ["run", "-q", "--image", "host", "-m", "script:{model}", "look around"],
    "box create": ["box", "create", "--image", "host", "--ttl", "5m"],
}


@pytest.mark.parametrize("way", sorted(ASKED))
def test_the_bwrap_backend_refuses_it_in_one_line_and_starts_nothing(way, tmp_path):
    """bubblewrap cannot hold a host box's hidden view: refused (UNSUPPORTED, 125) before any box starts, never run weaker."""
    model = scripts(tmp_path, look=[{"sh": "true"}, {"exit": "success"}]) / "look.yaml"
    env = {**os.environ, "QUINEBOX_BACKEND": "bwrap"}
    done = subprocess.run([QUINEBOX, *(arg.format(model=model) for arg in ASKED[way])], capture_output=True, timeout=60, env=env)
    said = done.stderr.decode()
    assert (done.returncode, done.stdout, said.count("\n")) == (125, b"", 1), said
    assert "refused on bwrap: --image host" in said and said.endswith("use --backend oci\n"), said
    records = os.path.join(os.environ["QUINEBOX_STATE_DIR"], "bwrap")  # a bwrap box's record is written before it starts
    assert not os.path.isdir(records) or os.listdir(records) == []


def test_the_bwrap_backend_refuses_it_to_the_python_api_as_unsupported():
    import quinebox
    from quinebox.errors import ErrorKind, QuineboxError

    with pytest.raises(QuineboxError) as refused:
        quinebox.exec(["true"], image="host", backend="bwrap")
    assert refused.value.kind == ErrorKind.UNSUPPORTED and "--image host" in str(refused.value), refused.value
