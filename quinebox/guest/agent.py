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

The material reaches fd 3 through a feeder that counts what the tools read of it (material.py), and each
request says that count: a session resumed after its host process was lost (`quinebox resume`) reads on
from there. Such a session's welcome hands the loop the conversation it was in and the turn in flight,
with the model's recorded answer to it when there was one, whose tool calls then run again.

Stdlib only: this file runs inside untrusted boxes.
"""

import json
import os
import socket
import sys
import threading

TYPE_CHECKING = False  # typing's flag, without importing typing (start-up): mypy reads the guest as the package, a box runs it flat
if TYPE_CHECKING:
    from quinebox.guest import forwarder, init, material, protocol
    from quinebox.guest.host import Host, Refused
    from quinebox.guest.prompt import FINAL_TOOLS, SYSTEM_PROMPT, TOOLS, network
    from quinebox.guest.tools import DELIVERABLE, DIAGNOSTICS, MATERIAL, fork, run_sh
    from quinebox.guest.worldplan import restore_world
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the guest directory is not a package on sys.path
    import forwarder
    import init
    import material
    import protocol
    from host import Host, Refused
    from prompt import FINAL_TOOLS, SYSTEM_PROMPT, TOOLS, network
    from tools import DELIVERABLE, DIAGNOSTICS, MATERIAL, fork, run_sh
    from worldplan import restore_world

NOTE_CAP = 64 << 10
SH_TIMEOUT = 120.0
SH_TIMEOUT_MAX = 3600.0


def say(text):
    os.write(DIAGNOSTICS, f"{text}\n".encode(errors="replace"))


def parse_args(argv):
    cycle, note, held, asker = 0, "", None, None
    while argv and argv[0] != "--":
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--cycle":
            cycle = int(value)
        elif flag == "--note":
            note = value
        elif flag == "--lifeline":
            held = int(value)
        elif flag == "--material":
            asker = int(value)
        else:
            raise SystemExit(f"quinebox agent: unknown option {flag}")
    return cycle, note, held, asker, " ".join(argv[1:])


def hold_lifeline(held):
    """Connect the lifeline (first cycle) or keep the one inherited across exec, and watch it."""
    if held is None:
        line = init.connect()
        if line is None:
            say("quinebox: the host is gone; not starting")
            raise SystemExit(137)
    else:
        line = socket.socket(fileno=held)
    os.set_inheritable(line.fileno(), True)  # survives exec; sh children never see it (close_fds)
    threading.Thread(target=init.watch, args=(line,), daemon=True).start()
    return line.fileno()


def setup_fds():
    """First cycle only: move the box's stdio to 3/4/5, so nothing printed by accident reaches the deliverable; the
    material comes to 3 through a feeder that counts what the tools read of it (material.py): the socket to ask it on."""
    for fd, target in ((1, DELIVERABLE), (2, DIAGNOSTICS)):
        os.dup2(fd, target)
    try:
        source = os.dup(0)
    except OSError:  # a box started with no stdin at all
        source = os.open(os.devnull, os.O_RDONLY)
    asker = material.start(source, MATERIAL)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    return asker


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
    cycle, note, held, asker, mission = parse_args(argv)
    asker = setup_fds() if cycle == 0 else socket.socket(fileno=asker) if asker is not None else None
    if asker is not None:
        os.set_inheritable(asker.fileno(), True)  # survives exec, as the feeder does
    held = hold_lifeline(held)
    # Again after each exec, which the listener does not survive; under a lifeline (a cold box) the lifeline's serves.
    forwarder.start(shared=True)
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
    system = SYSTEM_PROMPT.format(mission=mission, network=network(os.environ.get("QUINEBOX_NET", ""), os.environ.get("QUINEBOX_ASK", "")))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    history = host.welcome.get("history")
    if cycle == 0 and isinstance(history, list) and history and all(isinstance(m, dict) for m in history):
        messages = history  # a session forked from a recorded one goes on from its conversation
    turn, answer, again = 0, None, False
    resume = host.welcome.get("resume")
    if isinstance(resume, dict) and isinstance(resume.get("messages"), list) and all(isinstance(m, dict) for m in resume["messages"]):
        # A resumed session: its conversation as it was sent when the turn in flight was asked, and that turn again
        # (its prompt is in the conversation already); the model's recorded answer to it, if there was one.
        messages, cycle, turn, again = resume["messages"], int(resume.get("cycle") or 0), int(resume.get("turn") or 0), True
        answer = resume["answer"] if isinstance(resume.get("answer"), dict) else None
    while True:
        turn += 1
        final = turn > max_turns
        if final and not again:
            messages.append({"role": "user", "content": "Your turn budget is spent. This final turn may only call exit or exec."})
        again = False
        if answer is not None:
            reply, answer = answer, None
        else:
            asked = {"kind": "chat", "turn": turn, "cycle": cycle, "messages": messages, "tools": FINAL_TOOLS if final else TOOLS}
            read = material.ask(asker)
            if read is not None:
                asked["material"] = read
            try:
                reply = host.request(asked)
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
                    told = ["--material", str(asker.fileno())] if asker is not None else []
                    os.execv(sys.executable, [sys.executable, "-I", "-S", script, "--cycle", str(cycle + 1), "--lifeline", str(held), *told, "--note", note, "--", mission])
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
