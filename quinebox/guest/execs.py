"""Commands the host asks a box's init to start beside its main one, over the lifeline: the fast way into a live box.

A runtime's own `exec` starts a process of the runtime's (a Go program, ~25 ms) that enters the box's
namespaces and cgroups, sets its limits and seccomp, and only then runs the command. The init is in the box
already, with every one of those controls on it: a process it forks has them all by inheritance — namespaces,
cgroup, user, no capabilities, NoNewPrivs, the box's seccomp, rlimits — and costs a fork.

The host sends an `exec` frame with four descriptors: the command's stdin, stdout and stderr (the caller's own,
so no byte is relayed), and one end of a socket pair. The forked child says it is there on that socket, which
tells the host its pid as the host's kernel sees it (SCM_CREDENTIALS: the kernel's word, not ours); the host
moves it into the exec's own cgroup and answers, and only then does the child become the command. Whatever the
command starts is inside that cgroup, which nothing in the box can leave, so the host can end the exec's whole
tree. When the command exits, the init reaps it and sends `exec_exit` with its status, as a shell reports it.

Frames carry the number of descriptors sent with them ("fds"), and the host sends each frame and its
descriptors in one sendmsg, so they arrive with the frame's first bytes, never after it.

Runs inside untrusted boxes as part of the init: stdlib only, small, no state beyond the running execs.
"""

import _socket as socket
import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal

#: The most descriptors one frame carries (an exec's four).
MAX_FDS = 8
#: What the host answers on an exec's socket pair once the child is in its cgroup: anything else ends the child.
GO = b"g"
HEADER_SIZE = 8


class Line:
    """The init's end of its lifeline: frames (and the descriptors sent with them) in, status frames out."""

    def __init__(self, sock):
        self.sock = sock
        #: Frames read whole but not yet handled (those that came with a warm box's claim).
        self.pending = []
        self._buffer = b""
        self._fds = []

    def read(self):
        """What one recvmsg brings: a list of (message, fds) for each frame now whole; EOFError at the host's end."""
        data, ancillary, flags, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, blob in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                whole = len(blob) - len(blob) % 4
                self._fds += [int.from_bytes(blob[i : i + 4], sys.byteorder, signed=True) for i in range(0, whole, 4)]
        if not data:
            raise EOFError
        self._buffer += data
        frames = []
        while len(self._buffer) >= HEADER_SIZE:
            size, payload = int.from_bytes(self._buffer[:4], "big"), int.from_bytes(self._buffer[4:8], "big")
            if len(self._buffer) < HEADER_SIZE + size + payload:
                break
            message = json.loads(self._buffer[HEADER_SIZE : HEADER_SIZE + size])
            self._buffer = self._buffer[HEADER_SIZE + size + payload :]
            count = message.get("fds", 0) if isinstance(message, dict) else 0
            taken, self._fds = self._fds[:count], self._fds[count:]
            frames.append((message, taken))
        return frames

    def send(self, message):
        body = json.dumps(message, separators=(",", ":")).encode()
        try:
            self.sock.sendall(len(body).to_bytes(4, "big") + bytes(4) + body)
        except OSError:
            pass  # the host is gone: the loop sees the lifeline end and ends the box


class Execs:
    """The execs this init runs, by pid; `environ` is the box's own environment, which each adds to."""

    def __init__(self, line, environ):
        self.line = line
        self.environ = environ
        self.running = {}

    def start(self, message, fds):
        """Fork the exec's child; a malformed frame is answered with the status of a command that could not run."""
        try:
            argv = [str(a) for a in message["argv"]]
            cwd = str(message["cwd"])
            env = {**self.environ, **dict(str(e).split("=", 1) for e in message.get("env", ()))}
            exec_id = str(message["id"])
            if len(fds) != 4 or not argv:
                raise ValueError("an exec needs its command and four descriptors")
        except (KeyError, TypeError, ValueError):
            for fd in fds:
                os.close(fd)
            self.line.send({"kind": "exec_exit", "id": str(message.get("id", "")), "code": 125})
            return
        try:
            pid = os.fork()
        except OSError as exc:  # the box is out of processes or memory: the exec cannot start, the box goes on
            _say(fds[2], f"cannot start {argv[0]}: {exc.strerror}")
            pid = None
        if pid == 0:
            _become(argv, cwd, env, fds)
        for fd in fds:
            os.close(fd)
        if pid is None:
            self.line.send({"kind": "exec_exit", "id": exec_id, "code": 126})
        else:
            self.running[pid] = exec_id

    def reaped(self, pid, status):
        """An exec's child was reaped: tell the host its status (a signal's as 128+n). False: not an exec's."""
        exec_id = self.running.pop(pid, None)
        if exec_id is None:
            return False
        code = os.waitstatus_to_exitcode(status)
        self.line.send({"kind": "exec_exit", "id": exec_id, "code": code if code >= 0 else 128 - code})
        return True


def _say(fd, message):
    try:
        os.write(fd, f"quinebox: {message}\n".encode(errors="replace"))
    except OSError:
        pass


def _become(argv, cwd, env, fds):
    """In the forked child: the caller's stdio as ours, placed in the exec's cgroup by the host, then the command."""
    try:
        stdin, stdout, stderr, told = fds
        sync = os.dup(told)  # above 2, whatever the host's numbering: the stdio below must not close it
        for target, fd in enumerate((stdin, stdout, stderr)):
            os.dup2(fd, target)
        os.closerange(3, sync)
        os.closerange(sync + 1, 1 << 16)
        signal.set_wakeup_fd(-1)
        for signum in range(1, signal.NSIG):
            if signum not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(signum, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        os.setsid()  # its own session and process group: the init's signals and terminal are not its
        os.write(sync, b"r")  # the kernel attaches our pid, as the host sees it
        if os.read(sync, 1) != GO:
            os._exit(137)
        os.close(sync)
        os.chdir(cwd)
    except OSError as exc:
        _say(2, f"cannot start the command in {cwd}: {exc.strerror}")
        os._exit(126)
    try:
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        _say(2, f"{argv[0]}: command not found")
        os._exit(127)
    except OSError as exc:
        _say(2, f"{argv[0]}: cannot execute: {exc.strerror}")
        os._exit(126)
    finally:
        os._exit(127)
