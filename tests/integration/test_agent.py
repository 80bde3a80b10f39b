"""quinebox.run against a real box and the real openai client talking to our loopback server."""

import base64
import json
import os
import subprocess
import textwrap

import pytest
from openai_server import error, exit_, sh, text, tool

import quinebox
from quinebox.agent.store import read_tape


def tool_results(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]


def test_tool_calls_run_in_the_box_and_usage_is_counted(engine, fake_openai):
    fake_openai.steps = [sh("printf 'deliverable\\n' >&4; echo to-the-model", usage=(100, 20)), exit_()]
    result = quinebox.run("write the deliverable", input=b"")
    assert (result.returncode, result.stdout, result.termination) == (0, b"deliverable\n", "exit_success")
    assert len(fake_openai.requests) == 2
    first, second = fake_openai.requests
    assert first.headers["authorization"] == f"Bearer {os.environ['OPENAI_API_KEY']}"
    assert first.body["model"] == "test-model"
    assert [t["function"]["name"] for t in first.body["tools"]] == ["sh", "fork", "exec", "restore_world", "exit"]
    assert "write the deliverable" in first.body["messages"][0]["content"]
    [result_text] = tool_results(second)
    assert result_text.startswith("exit code 0\nstdout:\nto-the-model\n")
    assert "[turns left: 39; context used: 100 tokens]" in result_text
    assert (result.tokens, result.turns) == (120 + 15, 2)


def test_429_then_success(engine, fake_openai):
    fake_openai.steps = [error(429, "slow down", retry_after_ms=10), exit_()]
    result = quinebox.run("finish")
    assert (result.returncode, result.termination) == (0, "exit_success")
    assert len(fake_openai.requests) == 2


def test_500s_exhausted_exit_75(engine, fake_openai):
    fake_openai.steps = [error(500, "down", retry_after_ms=10)]
    result = quinebox.run("finish")
    assert (result.returncode, result.termination) == (75, "provider_unavailable")
    assert len(fake_openai.requests) == 3  # one try and QUINEBOX_MAX_RETRIES=2 retries
    assert b"unavailable after retries" in result.stderr


def test_unauthorized_is_one_clear_line(engine, fake_openai):
    fake_openai.steps = [error(401, "bad key")]
    result = quinebox.run("finish")
    assert (result.returncode, result.termination) == (125, "provider_rejected")
    assert result.stderr.count(b"\n") == 1 and b"OPENAI_API_KEY" in result.stderr


def test_check_raises_called_process_error_with_the_agents_outputs(engine, fake_openai):
    fake_openai.steps = [error(401, "bad key")]
    with pytest.raises(subprocess.CalledProcessError) as raised:
        quinebox.run("finish", check=True)
    failed = raised.value
    assert (failed.returncode, failed.cmd[-1], failed.output) == (125, "finish", b"")
    assert failed.stderr.count(b"\n") == 1 and b"OPENAI_API_KEY" in failed.stderr


def test_malformed_tool_arguments_go_back_to_the_model(engine, fake_openai):
    fake_openai.steps = [tool("sh", "{not json"), tool("frobnicate", {}), tool("sh", {"cmd": "x"}), text("just talking"), exit_()]
    result = quinebox.run("finish")
    assert result.returncode == 0
    assert "not valid JSON" in tool_results(fake_openai.requests[1])[0]
    assert "unknown tool 'frobnicate'" in tool_results(fake_openai.requests[2])[1]
    assert "sh needs a string 'command'" in tool_results(fake_openai.requests[3])[2]
    assert "reply with a tool call" in fake_openai.requests[4].body["messages"][-1]["content"]


def test_context_overflow_ends_cleanly(engine, fake_openai):
    fake_openai.steps = [sh("true"), error(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded")]
    result = quinebox.run("finish")
    assert (result.returncode, result.termination) == (1, "context_overflow")
    assert b"context window" in result.stderr


def test_a_model_that_loops_forever_is_stopped_by_the_turn_budget(engine, fake_openai):
    fake_openai.steps = [sh("true")]
    result = quinebox.run("loop", max_turns=5)
    assert (result.returncode, result.termination) == (1, "turn_exhaustion")
    assert len(fake_openai.requests) == 6  # five turns and the final one, offered only exec and exit
    assert [t["function"]["name"] for t in fake_openai.requests[-1].body["tools"]] == ["exec", "exit"]


def test_the_token_budget_is_enforced_by_the_host(engine, fake_openai):
    fake_openai.steps = [sh("true", usage=(40, 10))]
    result = quinebox.run("loop", max_tokens=120)
    assert (result.returncode, result.termination) == (1, "token_budget")
    assert len(fake_openai.requests) == 3
    assert result.tokens == 150


def test_provider_credentials_appear_nowhere_in_the_box(engine, fake_openai):
    key = os.environ["OPENAI_API_KEY"]
    # The key is passed in two halves, so no command line in the box ever holds it whole.
    probe = textwrap.dedent(
        """
        import glob, os, socket, sys
        key = (sys.argv[1] + sys.argv[2]).encode()
        hits = []
        for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
            try:
                hits += [path] if key in open(path, "rb").read() else []
            except OSError:
                pass
        for top in ("/world", "/tmp", "/opt", "/etc", "/home", "/root", "/run", "/usr", "/var"):
            for root, dirs, files in os.walk(top):
                for name in files:
                    try:
                        hits += [name] if key in open(os.path.join(root, name), "rb").read() else []
                    except OSError:
                        pass
        print("environ:", sorted(os.environ))
        print("hits:", hits)
        print("net:", sorted(name for _, name in socket.if_nameindex()))  # the kernel's answer: bwrap's box has no /sys
        """
    )
    encoded = base64.b64encode(probe.encode()).decode()
    fake_openai.steps = [sh(f"echo {encoded} | base64 -d > /tmp/probe.py; python3 /tmp/probe.py {key[:8]} {key[8:]}"), exit_()]
    result = quinebox.run("look around")
    seen = tool_results(fake_openai.requests[1])[0]
    assert result.returncode == 0
    assert "hits: []" in seen and "net: ['lo']" in seen
    assert "'QUINEBOX_SESSION'" in seen  # the probe did read its environment
    assert "OPENAI" not in seen and key not in seen and fake_openai.url not in seen


def test_the_box_has_no_network_even_to_the_model_server(engine, fake_openai):
    port = fake_openai.server.server_address[1]
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\" 2>&1 | tail -1"
    fake_openai.steps = [sh(probe), exit_()]
    quinebox.run("reach out")
    assert "Connection refused" in tool_results(fake_openai.requests[1])[0] or "unreachable" in tool_results(fake_openai.requests[1])[0]


def test_20_mb_of_material_through_fd_3_without_loading_it_whole(engine, fake_openai):
    material = os.urandom(20 << 20)
    fake_openai.steps = [sh("wc -c <&3 >&4; grep VmHWM /proc/$PPID/status >&5"), exit_()]
    result = quinebox.run("count bytes", input=material)
    assert result.stdout == b"20971520\n"
    peak_kb = int(result.stderr.split()[1])
    assert peak_kb < 16 * 1024, f"the agent loop peaked at {peak_kb} kB"


def test_deliverable_bytes_are_exact_binary_included(engine, fake_openai):
    material = os.urandom(1 << 20) + b"\x00\xff\n\r"
    fake_openai.steps = [sh("cat <&3 >&4; printf '\\000end' >&4"), exit_()]
    result = quinebox.run("copy", input=material)
    assert result.stdout == material + b"\x00end"


def test_exit_failure_exits_1_with_the_reason_on_stderr(engine, fake_openai):
    fake_openai.steps = [exit_("failure", "the material is empty")]
    result = quinebox.run("summarize")
    assert (result.returncode, result.stderr, result.termination) == (1, b"the material is empty\n", "exit_failure")


def test_exec_keeps_pid_and_stdin_position_over_nine_cycles(engine, tmp_path):
    turns = []
    for cycle in range(9):
        turns.append({"sh": 'read line <&3; echo "$line" >&4; echo $PPID >&5'})
        turns.append({"exec": f"read {cycle + 1} lines so far"} if cycle < 8 else {"exit": "success"})
    script = tmp_path / "scan.yaml"
    script.write_text(json.dumps({"turns": turns}))
    material = "".join(f"line {i}\n" for i in range(1, 21)).encode()
    result = quinebox.run("scan the material", input=material, model=f"script:{script}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"line {i}\n" for i in range(1, 10)).encode()
    pids = result.stderr.split()
    assert len(pids) == 9 and len(set(pids)) == 1
    tape = read_tape(result.session)
    assert [r["cycle"] for r in tape if r["kind"] == "exec" and "note" in r] == list(range(1, 9))


def test_every_record_is_on_the_tape(engine, fake_openai):
    fake_openai.steps = [sh("echo hi"), exit_()]
    result = quinebox.run("say hi")
    kinds = [r["kind"] for r in read_tape(result.session)]
    assert kinds == ["meta", "request", "response", "tool", "request", "response", "exit", "outcome"]
    outcome = read_tape(result.session)[-1]
    assert outcome["exit_code"] == 0 and outcome["termination"] == "exit_success" and outcome["tokens"] == 30


def test_a_guest_that_sends_garbage_does_not_harm_the_host(engine, fake_openai):
    attack = textwrap.dedent(
        """
        import socket, struct
        def conn():
            s = socket.socket(socket.AF_UNIX); s.connect("/run/quinebox/host.sock"); return s
        s = conn(); s.sendall(b"\\xff" * 64); print(s.recv(4096)[8:160])
        s = conn(); s.sendall(struct.pack(">II", 1 << 30, 0)); print(s.recv(4096)[8:160])
        s = conn(); body = b'{"kind": "chat", "messages": "x", "tools": []}'; s.sendall(struct.pack(">II", len(body), 0) + body); print(s.recv(4096)[8:160])
        s = conn(); body = b'{"kind": "launch-missiles"}'; s.sendall(struct.pack(">II", len(body), 0) + body); print(s.recv(4096)[8:160])
        """
    )
    encoded = base64.b64encode(attack.encode()).decode()
    fake_openai.steps = [sh(f"echo {encoded} | base64 -d | python3"), exit_()]
    result = quinebox.run("attack the host")
    assert result.returncode == 0
    answers = tool_results(fake_openai.requests[1])[0]
    assert answers.count('"kind":"error"') == 4
    for words in ("over the limit", "malformed chat", "unknown frame kind"):
        assert words in answers
    assert len(fake_openai.requests) == 2


def test_command_output_reaches_the_model_capped_with_a_truncation_note(engine, fake_openai):
    fake_openai.steps = [sh("head -c 20000 /dev/zero | tr '\\0' x; head -c 30000 /dev/zero | tr '\\0' y >&2"), exit_()]
    quinebox.run("be loud")
    [seen] = tool_results(fake_openai.requests[1])
    assert "stdout:\n" + "x" * 16384 + "\n[truncated: 20000 bytes total]\nstderr:\n" + "y" * 16384 + "\n[truncated: 30000 bytes total]" in seen
