"""The agent loop: a box's main process when the box runs a mission.

argv is the mission. The model is reached only through the host socket; the
host owns every decision about budgets and answers with the exit code to use
when it refuses. The model's tools:

  sh(command, timeout?)    fd 3 reads the material (the box's stdin), fd 4 writes the
                           deliverable (stdout), fd 5 diagnostics (stderr); fd 0 is
                           /dev/null; fd 1/2 are captured and shown to the model, capped.
  exec(note)               start afresh in the same process (same PID, same stdin
                           position) with the mission and the note.
  fork(children, mode)     child agents in boxes of their own (at most this box's grants),
                           each with a world built from this one (copy-on-write by default):
                           wait for all, race (first success wins, the rest are killed;
                           adopt: its world's changes come into this one), or forget
                           (detached, still bounded by the tree).
  restore_world(revision)  roll /world back to a revision (one is taken after each sh call
                           that changed files); the conversation keeps everything.
  exit(status, reason?)    success → exit 0; failure → exit 1, reason on stderr.

Stdlib only: this file runs inside untrusted boxes.
"""

import json
import os
import signal
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lifeline  # noqa: E402  (the guest directory is not a package on sys.path)
import protocol  # noqa: E402

HOST_SOCKET = "/run/quinebox/host.sock"
MATERIAL, DELIVERABLE, DIAGNOSTICS = 3, 4, 5
OUTPUT_CAP = 16 << 10
NOTE_CAP = 64 << 10
SH_TIMEOUT = 120.0
SH_TIMEOUT_MAX = 3600.0

SYSTEM_PROMPT = """You are an agent: a POSIX process in a sandbox (Debian, no network, read-only root; /world and /tmp are writable).
Your mission:

{mission}

Work only through tool calls. In `sh` commands, fd 3 reads the material you were given (your stdin), \
fd 4 writes your deliverable (your stdout, exactly as you write it) and fd 5 writes diagnostics. \
Plain stdout/stderr of a command come back to you, capped. \
For example: `wc -l <&3`, `printf 'done\\n' >&4`. The material is a stream: what you read is consumed.
Your files live in /world. After each sh call that changes them the host keeps a revision of /world, \
shown as [world revision N]; restore_world rolls the files back to one while you keep this conversation. \
Call fork to hand parts of the work to child agents, each in its own box with at most your grants \
and, by default, a copy-on-write view of your /world (their changes stay in their own world). \
Call exit with status "success" once the deliverable is written, or "failure" with a reason. \
Call exec with a note to yourself to continue in a fresh conversation when this one grows long."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "sh",
            "description": "Run a POSIX shell command in the box. fd 3 = material (stdin), fd 4 = deliverable (stdout), fd 5 = diagnostics.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command, run by /bin/sh -c."},
                    "timeout": {"type": "number", "description": "Seconds before the command is killed (default 120)."},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "fork",
            "description": "Start child agents, each in its own box with at most your grants. "
            "mode wait: all results; race: the first success wins and the others are killed; forget: start them and go on.",
            "parameters": {
                "type": "object",
                "properties": {
                    "children": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "mission": {"type": "string"},
                                "material": {"type": "string", "description": "The child's stdin."},
                                "grants": {"type": "array", "items": {"type": "string"}},
                                "model": {"type": "string"},
                                "world": {
                                    "description": 'The child\'s /world: "inherit" (default; copy-on-write view of yours), "empty", or a list of paths in yours to copy.',
                                    "oneOf": [{"type": "string", "enum": ["inherit", "empty"]}, {"type": "array", "items": {"type": "string"}}],
                                },
                            },
                            "required": ["mission"],
                        },
                    },
                    "mode": {"type": "string", "enum": ["wait", "race", "forget"]},
                    "adopt": {"type": "boolean", "description": "race only: bring the winner's changes to its world into yours."},
                },
                "required": ["children", "mode"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "exec",
            "description": "Continue in a fresh conversation: same box, same files, same read position in the material; you keep only the mission and this note.",
            "parameters": {
                "type": "object",
                "properties": {"note": {"type": "string", "description": "What your next self needs to know."}},
                "required": ["note"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "restore_world",
            "description": "Roll the files in /world back to a revision; you keep this conversation, and the state before the restore is kept as a revision too.",
            "parameters": {
                "type": "object",
                "properties": {"revision": {"type": "integer", "description": "A revision number shown as [world revision N]; 0 is the world you started with."}},
                "required": ["revision"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "exit",
            "description": "Finish: success exits 0; failure exits 1 with the reason on stderr.",
            "parameters": {
                "type": "object",
                "properties": {
                    "status": {"type": "string", "enum": ["success", "failure"]},
                    "reason": {"type": "string"},
                },
                "required": ["status"],
            },
        },
    },
]
FINAL_TOOLS = [t for t in TOOLS if t["function"]["name"] in ("exec", "exit")]


class Refused(Exception):
    """The host declined a request; it says which exit code ends the agent."""

    def __init__(self, message):
        super().__init__(message.get("message", "refused"))
        self.code = message.get("code", "refused")
        self.exit_code = int(message.get("exit_code", 1))


class Host:
    def __init__(self, cycle):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(HOST_SOCKET)
        self.reader = self.sock.makefile("rb")
        self.welcome = self.request({"kind": "hello", "role": "agent", "cycle": cycle})

    def request(self, message):
        self.sock.sendall(protocol.encode(message))
        reply, _ = protocol.read_frame(self.reader)
        if reply["kind"] == "error":
            raise Refused(reply)
        return reply

    def event(self, **fields):
        self.sock.sendall(protocol.encode({"kind": "event", **fields}))

    def revise(self, turn, what, command=None):
        """Ask the host to keep a revision of /world; the note the model sees, if one was made."""
        try:
            reply = self.request({"kind": "revise", "turn": turn, "what": what, "command": command})
        except Refused as exc:
            return f"\n[world: no revision: {exc}]"
        return f"\n[world revision {reply['rev']}: {reply['paths']} path(s) changed]" if reply.get("new") else ""


WORLD = "/world"


def clear(path):
    """Remove whatever is at path (a directory with its contents); never follows a symlink."""
    import shutil

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


class Incoming:
    """The files' bytes that follow a world plan, one file after another, as they arrive:
    a file is written chunk by chunk, never held whole."""

    def __init__(self, reader):
        self.reader = reader
        self.pending = bytearray()
        self.left = 0  # bytes of the current file not yet taken

    def chunks(self):
        while self.left:
            if not self.pending:
                frame, payload = protocol.read_frame(self.reader)
                if frame["kind"] != "world_data":
                    raise protocol.ProtocolError(f"expected world data, got {frame['kind']!r}")
                self.pending.extend(payload)
            size = min(self.left, len(self.pending))
            chunk = bytes(self.pending[:size])
            del self.pending[:size]
            self.left -= size
            yield chunk


def apply_plan(host, request):
    """Ask the host for a plan for /world and carry it out; (the plan or an error text, what failed)."""
    host.sock.sendall(protocol.encode(request))
    plan, _ = protocol.read_frame(host.reader)
    if plan["kind"] == "error":
        return f"error: {plan.get('message')}", []
    failed = []
    incoming = Incoming(host.reader)

    def attempt(action, rel, *args):
        try:
            action(os.path.join(WORLD, rel), *args)
        except OSError as exc:
            failed.append(f"{rel}: {exc.strerror or exc}")

    def make_dir(path, mode):
        if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
            clear(path)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o700 | mode)

    def make_link(path, target):
        clear(path)
        os.symlink(target, path)

    def write(path, mode, mtime):
        clear(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in incoming.chunks():
                out.write(chunk)
            os.fchmod(out.fileno(), mode)
        if mtime:
            os.utime(path, ns=(mtime, mtime), follow_symlinks=False)

    for rel in plan["remove"]:
        attempt(clear, rel)
    for rel, mode in plan["dirs"]:
        attempt(make_dir, rel, mode)
    for rel, target in plan["links"]:
        attempt(make_link, rel, target)
    for rel, mode, size, mtime in plan["files"]:
        incoming.left = size
        attempt(write, rel, mode, mtime)
        for _ in incoming.chunks():  # what a failed write did not take: the stream goes on
            pass
    for rel, mode in reversed(plan["dirs"]):
        attempt(os.chmod, rel, mode)
    return plan, failed


def listed(label, items, limit=50):
    return f"{label}: " + "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def restore_world(host, revision):
    """Roll /world back; the tool result, saying what was undone (the host checks the revision)."""
    plan, failed = apply_plan(host, {"kind": "restore_world", "revision": revision})
    if isinstance(plan, str):
        return plan
    undone = plan.get("undone") or []
    lines = [f"/world is back at revision {revision}; your conversation is unchanged."]
    lines.append(listed("Undone", undone) if undone else "Nothing had changed since then.")
    lines.append(f"The world as it was just before this restore is revision {plan['before']}.")
    if failed:
        lines.append(listed("Could not restore", failed, 20))
    return "\n".join(lines)


def adopt_world(host, session):
    """Bring a finished child's changes into /world; a line for the fork's result."""
    plan, failed = apply_plan(host, {"kind": "adopt", "session": session})
    if isinstance(plan, str):
        return plan
    text = listed(f"adopted {session}'s world", plan.get("adopted") or []) if plan.get("adopted") else f"{session} changed nothing in its world"
    return text + (("; " + listed("could not write", failed, 20)) if failed else "")


def say(text):
    os.write(DIAGNOSTICS, f"{text}\n".encode(errors="replace"))


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

    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(MATERIAL, DELIVERABLE, DIAGNOSTICS),
        start_new_session=True,
    )
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
    import cli  # the in-box command's client; argparse and all, so only when forking

    if mode not in ("wait", "race", "forget") or not isinstance(children, list) or not children:
        return "error: fork needs a non-empty list of children and a mode of wait, race or forget"
    started, results = [], [None] * len(children)
    for index, spec in enumerate(children):
        if not isinstance(spec, dict) or not isinstance(spec.get("mission"), str):
            results[index] = {"error": "each child needs a string mission"}
            continue
        request = {"kind": "spawn", "what": "run", "mission": spec["mission"], "grants": spec.get("grants") or [],
                   "model": spec.get("model"), "world": spec.get("world"), "cwd": os.getcwd(), "detach": mode == "forget"}
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
    winner = []

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

    threads = [threading.Thread(target=follow, args=pair) for pair in started]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcome = {"mode": mode, "children": results}
    if mode == "race":
        outcome["winner"] = winner[0] if winner else None
        if adopt and winner:
            outcome["adopted"] = adopt_world(host, results[winner[0]]["session"])
    return json.dumps(outcome, indent=1)


def parse_args(argv):
    cycle, note, held = 0, "", None
    while argv and argv[0] != "--":
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--cycle":
            cycle = int(value)
        elif flag == "--note":
            note = value
        elif flag == "--lifeline":
            held = int(value)
        else:
            raise SystemExit(f"quinebox agent: unknown option {flag}")
    return cycle, note, held, " ".join(argv[1:])


def hold_lifeline(held):
    """Connect the lifeline (first cycle) or keep the one inherited across exec, and watch it."""
    if held is None:
        line = lifeline.connect()
        if line is None:
            say("quinebox: the host is gone; not starting")
            raise SystemExit(137)
    else:
        line = socket.socket(fileno=held)
    line.set_inheritable(True)  # survives exec; sh children never see it (close_fds)
    threading.Thread(target=lifeline.watch, args=(line,), daemon=True).start()
    return line.fileno()


def setup_fds():
    """First cycle only: move the box's stdio to 3/4/5, so nothing printed by accident reaches the deliverable."""
    for fd, target in ((0, MATERIAL), (1, DELIVERABLE), (2, DIAGNOSTICS)):
        os.dup2(fd, target)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)


def tool_call(call):
    """(name, args or None, error text or None) from one tool call, whatever the model sent."""
    function = call.get("function") or {}
    name = function.get("name")
    try:
        args = json.loads(function.get("arguments") or "{}")
    except ValueError as exc:
        return name, None, f"error: the arguments are not valid JSON ({exc}); call {name} again with a JSON object"
    if not isinstance(args, dict):
        return name, None, f"error: the arguments must be a JSON object; call {name} again"
    return name, args, None


def main(argv):
    cycle, note, held, mission = parse_args(argv)
    if cycle == 0:
        setup_fds()
    held = hold_lifeline(held)
    try:
        host = Host(cycle)
    except (OSError, protocol.ProtocolError, EOFError) as exc:
        say(f"quinebox: cannot reach the host: {exc}")
        return 125
    except Refused as exc:
        say(f"quinebox: {exc}")
        return exc.exit_code
    max_turns = int(host.welcome.get("max_turns", 40))
    cycles_left = int(host.welcome.get("cycles_left", 0))
    first = "Begin." if not note else f"You are continuing earlier work. Your note to yourself:\n\n{note}"
    messages = [{"role": "system", "content": SYSTEM_PROMPT.format(mission=mission)}, {"role": "user", "content": first}]
    history = host.welcome.get("history")
    if cycle == 0 and isinstance(history, list) and history and all(isinstance(m, dict) for m in history):
        messages = history  # a session forked from a recorded one goes on from its conversation
    turn = 0
    while True:
        turn += 1
        final = turn > max_turns
        if final:
            messages.append({"role": "user", "content": "Your turn budget is spent. This final turn may only call exit or exec."})
        try:
            reply = host.request({"kind": "chat", "turn": turn, "cycle": cycle, "messages": messages, "tools": FINAL_TOOLS if final else TOOLS})
        except Refused as exc:
            say(f"quinebox: {exc}")
            return exc.exit_code
        except (OSError, protocol.ProtocolError, EOFError) as exc:
            say(f"quinebox: lost the host: {exc}")
            return 125
        message = reply.get("message") or {}
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        calls = message.get("tool_calls") or []
        if not calls:
            if final:
                break
            messages.append({"role": "user", "content": "error: reply with a tool call (sh, fork, exec or exit); plain text does nothing here."})
            continue
        context = (reply.get("usage") or {}).get("prompt_tokens", 0)
        hint = f"\n[turns left: {max(0, max_turns - turn)}; context used: {context} tokens]"
        for call in calls:
            name, args, error = tool_call(call)
            if error is None and final and name not in ("exec", "exit"):
                error = f"error: {name} is not allowed on the final turn"
            if error is None and name == "sh":
                command = args.get("command")
                try:
                    timeout = min(float(args.get("timeout") or SH_TIMEOUT), SH_TIMEOUT_MAX)
                except (TypeError, ValueError):
                    timeout = SH_TIMEOUT
                if not isinstance(command, str):
                    error = "error: sh needs a string 'command'"
                else:
                    code, result = run_sh(command, timeout)
                    host.event(event="tool", turn=turn, name="sh", args={"command": command}, exit_code=code, result=result)
                    result += host.revise(turn, "sh", command)
            elif error is None and name == "exit":
                status, reason = args.get("status"), str(args.get("reason") or "")
                if status not in ("success", "failure"):
                    error = "error: exit needs status 'success' or 'failure'"
                else:
                    host.event(event="exit", turn=turn, status=status, reason=reason)
                    if status == "failure":
                        say(reason or "the agent reported failure")
                        return 1
                    return 0
            elif error is None and name == "fork":
                result = fork(args.get("children"), args.get("mode"), bool(args.get("adopt")), host)
                host.event(event="tool", turn=turn, name="fork", args={"mode": args.get("mode"), "children": len(args.get("children") or [])}, exit_code=0, result=result)
                if args.get("adopt"):
                    result += host.revise(turn, "adopt", "fork: adopted the winner's world")
            elif error is None and name == "restore_world":
                try:
                    result = restore_world(host, args.get("revision"))
                except (OSError, EOFError, protocol.ProtocolError) as exc:
                    say(f"quinebox: lost the host: {exc}")
                    return 125
                host.event(event="tool", turn=turn, name="restore_world", args={"revision": args.get("revision")}, exit_code=0, result=result)
                result += host.revise(turn, "restore_world", f"restore_world {args.get('revision')}")
            elif error is None and name == "exec":
                if cycles_left <= 0:
                    error = "error: no exec cycles left; finish with exit"
                else:
                    note = str(args.get("note") or "")[:NOTE_CAP]
                    host.event(event="exec", turn=turn, cycle=cycle + 1, note=note)
                    script = os.path.abspath(__file__)
                    os.execv(sys.executable, [sys.executable, "-I", "-S", script, "--cycle", str(cycle + 1), "--lifeline", str(held), "--note", note, "--", mission])
            elif error is None:
                error = f"error: unknown tool {name!r}; the tools are sh, fork, restore_world, exec and exit"
            if error is not None:
                host.event(event="tool_error", turn=turn, name=str(name), error=error)
                result = error
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result + hint})
        if final:
            break
    host.event(event="terminated", turn=turn, termination="turn_exhaustion")
    say("quinebox: the agent spent its turn budget without calling exit")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
