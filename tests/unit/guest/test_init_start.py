"""A box's init at its start (guest/lifeline.py, guest/init.py), paid by every box: what Python compiles and imports
before the box's command runs. Run as a box runs it (`-I -S`, the guest's directory flat), on this host's Python, over
a real Unix socket standing in for the host's."""

import ast
import os
import socket
import subprocess
import sys
import threading

from quinebox.resources import guest_dir

#: What the init may import beyond the interpreter's own start-up: itself and builtin modules, nothing on disk but it.
ALLOWED = {"init", "_socket", "select", "_signal"}

RUN = """
import sys
before = set(sys.modules)
sys.path.insert(0, {guest!r})
import init
init.HOST_SOCKET = {sock!r}
status = init.main(["--", "sh", "-c", "exit 7"])
print(status, " ".join(sorted(set(sys.modules) - before)))
"""


def test_the_script_python_compiles_at_each_start_holds_no_code_of_the_init():
    """Python compiles the script it runs from source at every start (never its cached bytecode): ~3 ms of CPU of every
    box's while the init's code was the script. Its code is init.py's, read from the runtime's compiled bytecode."""
    tree = ast.parse((guest_dir() / "lifeline.py").read_text())
    defined = [node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    assert defined == []
    assert len((guest_dir() / "lifeline.py").read_bytes()) < 4096


def test_the_init_runs_the_command_on_builtin_modules_alone(tmp_path):
    """A cold box's init connects, says hello, runs its command and gives its status, importing no module from disk but
    itself (`os` alone, its path and mapping modules, is ~1 ms of each start; json, enum and threading more)."""
    path = str(tmp_path / "host.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    heard = []

    def host():
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                heard.append(data)

    hearing = threading.Thread(target=host, daemon=True)
    hearing.start()
    try:
        ran = subprocess.run([sys.executable, "-I", "-S", "-c", RUN.format(guest=str(guest_dir()), sock=path)],
                             capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
        hearing.join(10)
    finally:
        listener.close()
    assert (ran.returncode, ran.stderr) == (0, ""), ran.stderr
    status, imported = ran.stdout.split(" ", 1)
    assert status == "7"
    assert set(imported.split()) <= ALLOWED, imported
    hello = b'{"kind":"hello","role":"lifeline","serves":["exec"]}'
    assert b"".join(heard) == len(hello).to_bytes(4, "big") + bytes(4) + hello
