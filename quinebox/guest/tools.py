"""The model's `sh` and `fork` tools, and how their output is shown to it, capped.

Stdlib only: it runs inside boxes.
"""

import json
import os
import signal
import threading

TYPE_CHECKING = False  # typing's flag, without importing typing (start-up): mypy reads the guest as the package, a box runs it flat
if TYPE_CHECKING:
    from quinebox.guest import protocol
    from quinebox.guest.worldplan import adopt_world
else:
    import protocol
    from worldplan import adopt_world

#: The box's stdin, stdout and stderr, as the agent's sh commands see them.
MATERIAL, DELIVERABLE, DIAGNOSTICS = 3, 4, 5
OUTPUT_CAP = 16 << 10
#: Where `quinebox` (the relay to the host) is, after the image's own PATH.
IN_BOX_BIN = "/.quinebox/bin"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Collected:
    """Output as the model sees it: the first OUTPUT_CAP bytes, and how many there were in all."""

    def __init__(self):
        self.kept = bytearray()
        self.total = 0

    def __call__(self, data):
        self.total += len(data)
        if len(self.kept) < OUTPUT_CAP:
            self.kept += data[: OUTPUT_CAP - len(self.kept)]

    def drain(self, stream):
        """Read a pipe to its end."""
        for chunk in iter(lambda: stream.read(65536), b""):
            self(chunk)

    def text(self):
        text = self.kept.decode(errors="replace")
        return text + (f"\n[truncated: {self.total} bytes total]" if self.total > len(self.kept) else "")

    def shown(self, name):
        text = self.text()
        return f"{name}:\n{text}" if text else f"{name}: (empty)"


def run_sh(command, timeout):
    import subprocess  # not needed by missions that never call sh

    environment = dict(os.environ)  # the image's own, as the box was given it
    environment["PATH"] = environment.get("PATH", DEFAULT_PATH) + ":" + IN_BOX_BIN
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(MATERIAL, DELIVERABLE, DIAGNOSTICS),
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:  # a command past the kernel's argument limit (E2BIG), or holding a NUL
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        return 126, f"error: the command cannot be run ({why}; it is {len(command.encode(errors='replace'))} bytes): write a long script to a file under /tmp and run that"
    out, err = Collected(), Collected()
    readers = [threading.Thread(target=out.drain, args=(proc.stdout,)), threading.Thread(target=err.drain, args=(proc.stderr,))]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for reader in readers:
        reader.join()
    status = f"killed after {timeout:g} s (timeout)" if timed_out else f"exit code {proc.returncode}"
    return proc.returncode, f"{status}\n{out.shown('stdout')}\n{err.shown('stderr')}"


def fork(children, mode, adopt=False, host=None):
    """Start the children over the host socket; their results as the model reads them."""
    if TYPE_CHECKING:
        from quinebox.guest import cli
    else:
        import cli  # the in-box command's client; argparse and all, so only when forking

    if mode not in ("wait", "race", "forget") or not isinstance(children, list) or not children:
        return "error: fork needs a non-empty list of children and a mode of wait, race or forget"
    started: list[tuple[int, cli.Child]] = []
    results: list[dict | None] = [None] * len(children)
    for index, spec in enumerate(children):
        if not isinstance(spec, dict) or not isinstance(spec.get("mission"), str):
            results[index] = {"error": "each child needs a string mission"}
            continue
        request = {"kind": "spawn", "what": "run", "mission": spec["mission"], "grants": spec.get("grants") or [],
                   "model": spec.get("model"), "image": spec.get("image"), "world": spec.get("world"), "cwd": os.getcwd(), "detach": mode == "forget"}
        try:
            child = cli.Child(request)
            material = str(spec.get("material") or "").encode()
            for start in range(0, len(material), cli.CHUNK):
                child.send({"kind": "stdin"}, material[start : start + cli.CHUNK])
            child.send({"kind": "stdin", "eof": True})
        except OSError as exc:
            results[index] = {"error": f"cannot reach the host: {exc}"}
            continue
        started.append((index, child))
    winner: list[int] = []

    def follow(index, child):
        out, err = Collected(), Collected()
        try:
            code = child.relay(out, err, until_spawned=mode == "forget")
        except (OSError, EOFError, protocol.ProtocolError) as exc:
            code, err = 125, Collected()
            err(f"lost the host: {exc}".encode())
        result = {"mission": children[index]["mission"], "session": child.session}
        if mode != "forget":
            result.update(exit_code=code, stdout=out.text(), stderr=err.text())
        results[index] = result
        if mode == "race" and code == 0 and not winner:
            winner.append(index)
            for other_index, other in started:
                if other_index != index:
                    try:
                        other.send({"kind": "kill"})
                    except OSError:
                        pass
        child.sock.close()

    threads: list[threading.Thread] = []
    for index, child in started:
        thread = threading.Thread(target=follow, args=(index, child))
        try:
            thread.start()
        except RuntimeError:  # no thread left under the box's pids limit: this child is stopped, not left unread
            results[index] = {"mission": children[index]["mission"], "session": None, "exit_code": 125, "stdout": "",
                              "stderr": "quinebox: this box's pids limit leaves no thread to follow this child: fork fewer children at once, or grant it more pids\n"}
            child.sock.close()  # the host kills a child whose connection is gone
            continue
        threads.append(thread)
    for thread in threads:
        thread.join()
    outcome = {"mode": mode, "children": results}
    if mode == "race":
        outcome["winner"] = winner[0] if winner else None
        won = results[winner[0]] if winner else None  # the winner's result is in before it is the winner
        if adopt and won:
            outcome["adopted"] = adopt_world(host, won["session"])
    return json.dumps(outcome, indent=1)
