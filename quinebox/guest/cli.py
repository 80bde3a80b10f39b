#!/usr/bin/python3 -IS
"""`quinebox` inside a box: the same `run` and `exec` as on the host, one level down.

It asks the host, over the box's socket, to start a child box (the host
decides what the child may have: at most what this box holds), then relays
the child's stdin, stdout, stderr and exit status, so pipes, `&&`, `&` and
redirections compose in a box as they do outside. Stdlib only.
"""

import argparse
import os
import signal
import socket
import sys
import threading

TYPE_CHECKING = False  # typing's flag, without importing typing (start-up): mypy reads the guest as the package, a box runs it flat
if TYPE_CHECKING:
    from quinebox.guest import protocol
else:
    sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
    import protocol

HOST_SOCKET = "/run/quinebox/host.sock"
CHUNK = 64 << 10


def parse(argv):
    parser = argparse.ArgumentParser(prog="quinebox", description="Start a child box (inside a box).")
    commands = parser.add_subparsers(dest="what", required=True)
    run = commands.add_parser("run", help="run an agent: MISSION, stdin material, stdout deliverable")
    run.add_argument("mission")
    run.add_argument("-m", "--model")
    run.add_argument("--max-turns", type=int)
    run.add_argument("-q", "--quiet", action="store_true", help="accepted for symmetry; children are always quiet")
    run.add_argument("--json", action="store_true", help="accepted for symmetry")
    execute = commands.add_parser("exec", help="run CMD in a fresh box")
    execute.add_argument("argv", nargs=argparse.REMAINDER)
    for command in (run, execute):
        command.add_argument("-g", "--grant", action="append", default=[])
        command.add_argument("--timeout")
        command.add_argument("--memory")
        command.add_argument("--cpus")
        command.add_argument("--pids")
        command.add_argument("-e", "--env", action="append", default=[])
        command.add_argument("-w", "--workdir")
        command.add_argument("--image", help="an image the host already has (default: this box's)")
        command.add_argument("--world-from", nargs="+", metavar="inherit|empty|PATH", help="the child's /world (default: inherit)")
    args = parser.parse_args(argv)
    grants = list(args.grant) + [f"env:{e}" for e in args.env]
    for kind, value in (("mem", args.memory), ("cpus", args.cpus), ("pids", args.pids)):
        if value:
            grants.append(f"{kind}:{value}")
    world = args.world_from
    if world in (["inherit"], ["empty"]):
        world = world[0]
    elif world:
        world = [os.path.abspath(p) for p in world]  # the host reads them as paths in this box's /world
    request = {"kind": "spawn", "what": args.what, "grants": grants, "timeout": args.timeout, "workdir": args.workdir, "cwd": os.getcwd(), "world": world, "image": args.image}
    if args.what == "run":
        request.update(mission=args.mission, model=args.model, max_turns=args.max_turns)
    else:
        request["argv"] = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not request["argv"]:
            parser.error("exec needs a command: quinebox exec -- CMD [ARGS...]")
    return request


class Child:
    def __init__(self, request):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(HOST_SOCKET)
        self.reader = self.sock.makefile("rb")
        self.lock = threading.Lock()
        self.session = None
        self.send(request)

    def send(self, message, payload=b""):
        with self.lock:
            self.sock.sendall(protocol.encode(message, payload))

    def pump_stdin(self, fd=0):
        try:
            while True:
                data = os.read(fd, CHUNK)
                if not data:
                    break
                self.send({"kind": "stdin"}, data)
            self.send({"kind": "stdin", "eof": True})
        except OSError:
            pass

    def relay(self, out, err, until_spawned=False):
        """Hand the child's output to `out`/`err` until it exits; its exit status."""
        sinks = {"stdout": out, "stderr": err}
        while True:
            message, payload = protocol.read_frame(self.reader)
            kind = message["kind"]
            if kind in sinks:
                sinks[kind](payload)
            elif kind == "spawned":
                self.session = message.get("session")
                if until_spawned:
                    return 0
            elif kind == "exit":
                return int(message["code"])
            elif kind == "error":
                err(f"quinebox: {message.get('message')}\n".encode(errors="replace"))
                return int(message.get("exit_code", 125))


def fd_writer(fd):
    def write(data):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write


def main(argv):
    request = parse(argv)
    try:
        child = Child(request)
    except OSError as exc:
        os.write(2, f"quinebox: cannot reach the host: {exc.strerror}\n".encode())
        return 125
    received = []

    def on_signal(signum, _frame):
        received.append(signum)
        try:
            child.send({"kind": "kill"})
        except OSError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    threading.Thread(target=child.pump_stdin, daemon=True).start()
    try:
        code = child.relay(fd_writer(1), fd_writer(2))
    except BrokenPipeError:
        child.send({"kind": "kill"})
        return 141
    except (OSError, EOFError, protocol.ProtocolError) as exc:
        os.write(2, f"quinebox: lost the host: {exc}\n".encode())
        return 125
    return 128 + received[0] if received else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
