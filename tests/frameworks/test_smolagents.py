"""smolagents' own CodeAgent, its code actions run by quinebox's executor: a real agent loop driven by a scripted model
(smolagents' `Model` interface), no network and no key. What a user depends on: a variable one action made is there
for the next (as in smolagents' Docker executor), the code runs in the box and not here, an exception reaches the
agent as its error with the box's traceback, `final_answer` ends the run with its value, and pip installs into the box
only where it has pip and a network grant (else one line, at once)."""

from __future__ import annotations

import functools
import http.server
import io
import statistics
import threading
import time
import uuid
from pathlib import Path

import pytest
from package_index import write_index
from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.utils import AgentError

from quinebox import QuineboxError
from quinebox.integrations.smolagents import QuineboxExecutor

#: An image with Debian's python3-pip (as tests/e2e/test_egress.py builds it, from Debian's packages, no registry).
PIP_IMAGE = "quinebox-test/clients:1"


class ScriptedModel(Model):
    """A model that answers each call with the next of its code actions, in CodeAgent's <code> format, and keeps
    what it was shown (the agent's observations and errors)."""

    def __init__(self, *actions: str):
        super().__init__(model_id="scripted")
        self.actions = list(actions)
        self.shown: list[str] = []

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs) -> ChatMessage:
        self.shown.append("\n".join(str(m.content if hasattr(m, "content") else m) for m in messages))
        return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: next step.\n<code>\n{self.actions.pop(0)}\n</code>")


@pytest.fixture
def executor():
    made = QuineboxExecutor(timeout=30)
    yield made
    made.cleanup()


def test_a_code_agent_keeps_its_variables_between_actions_in_the_box(executor):
    token = uuid.uuid4().hex
    executor.sandbox.write_file("marker", token)  # in the box's working directory: nowhere on this host
    model = ScriptedModel(
        "import os\nmarker = open('marker').read()\nprint('read', len(marker), 'bytes in', os.getcwd())",
        "shout = marker.upper() + '@' + planet\nprint(shout[:4])",
        "final_answer({'shout': shout, 'cwd': os.getcwd(), 'uid': os.getuid()})",
    )
    agent = CodeAgent(tools=[], model=model, executor=executor)
    answer = agent.run("Read the marker, shout it, answer.", max_steps=5, additional_args={"planet": "mars"})  # sent by send_variables
    box_uid = int(executor.sandbox.exec(["id", "-u"], timeout=30).stdout)
    assert answer == {"shout": token.upper() + "@mars", "cwd": executor.sandbox.workdir, "uid": box_uid}
    assert not Path(executor.sandbox.workdir, "marker").exists()
    assert model.actions == []  # three model calls: the third ended the run
    assert f"read 32 bytes in {executor.sandbox.workdir}" in model.shown[1]
    assert token.upper()[:4] in model.shown[2]


def test_an_exception_reaches_the_agent_as_its_error_and_the_state_stays(executor):
    model = ScriptedModel(
        "kept = 7\nprint('before the error')\ndef planet(n):\n    raise ValueError(f'no such planet: {n}')\nplanet(kept)",
        "final_answer(kept * 6)",
    )
    agent = CodeAgent(tools=[], model=model, executor=executor)
    assert agent.run("Fail once, then answer.", max_steps=4) == 42
    error = agent.memory.steps[1].error
    assert error is not None and "ValueError" in str(error) and "no such planet: 7" in str(error)
    assert 'File "<action' in str(error) and "in planet" in str(error)  # the box's traceback, of the action's own lines
    assert "no such planet: 7" in model.shown[1] and "before the error" in model.shown[1]


def test_the_executor_runs_what_a_kernel_would(executor):
    out = executor("import subprocess\nprint('from python')\nsubprocess.run(['echo', 'from a child'])\nn = 20\nn + 22")
    assert (out.output, out.logs, out.is_final_answer) == (42, "from python\nfrom a child\n", False)
    assert executor("{'a': [1, 2.5, None, 'x']}").output == {"a": [1, 2.5, None, "x"]}
    assert executor("(n, {1})").output == "(20, {1})"  # not plain JSON: its repr, as a kernel shows it
    assert executor("print('x' * 3_000_000)").logs.count("bytes of output left out") == 1
    with pytest.raises(AgentError, match="SyntaxError"):
        executor("if")
    with pytest.raises(AgentError, match="SystemExit"):
        executor("raise SystemExit(3)")  # the interpreter stays: exit() in an action is the action's error
    assert executor("n").output == 20


def test_a_timeout_interrupts_the_action_and_keeps_the_variables():
    with QuineboxExecutor(timeout=1.0) as executor:
        executor("n = 5")
        began = time.monotonic()
        with pytest.raises(AgentError, match="ran longer than its timeout"):
            executor("import time\nwhile True:\n    time.sleep(0.05)")
        assert time.monotonic() - began < 5
        assert executor("n").output == 5


def test_an_interpreter_that_ends_is_replaced_with_the_tools_again(executor):
    agent = CodeAgent(tools=[], model=ScriptedModel("n = 1", "import os\nos._exit(9)", "final_answer('gone' if 'n' not in globals() else 'kept')"), executor=executor)
    assert agent.run("End the interpreter, then answer.", max_steps=4) == "gone"  # final_answer is there again
    assert "exit status 9" in str(agent.memory.steps[2].error)


def test_a_box_that_forges_an_answer_is_refused_not_believed(executor):
    """The answers' fd is the box's to write: an action that claims an answer of an exabyte is refused at its header."""
    forge = "import os\nfor fd in range(3, 12):\n    try:\n        os.write(fd, b'999999999999999999\\n')\n    except OSError:\n        pass\nimport time\ntime.sleep(60)"
    began = time.monotonic()
    with pytest.raises(AgentError, match="broke the protocol"):
        executor(forge)
    assert time.monotonic() - began < 10
    assert executor("6 * 7").output == 42  # a new interpreter


def test_latency_of_an_action_against_a_direct_exec():
    began = time.monotonic()
    executor = QuineboxExecutor()
    made = time.monotonic() - began
    executor("1")
    actions, execs = [], []
    for _ in range(15):
        began = time.monotonic()
        executor("x = 1\nx")
        actions.append(time.monotonic() - began)
        began = time.monotonic()
        done = executor.sandbox.exec(["python3", "-c", "x = 1"], timeout=30)
        execs.append(time.monotonic() - began)
        assert done.returncode == 0
    action, direct = statistics.median(actions), statistics.median(execs)
    executor.cleanup()
    print(f"\nQuineboxExecutor() (box and interpreter up): {made * 1000:.0f} ms; a code action through it: median {action * 1000:.1f} ms;"
          f" sb.exec(python3 -c) in the same box: median {direct * 1000:.1f} ms")
    assert action < direct  # the interpreter is started once, not per action


def test_packages_the_box_has_need_nothing_and_what_it_lacks_is_refused_in_one_line(executor):
    assert executor.install_packages(["json", "email.*"]) == ["json", "email.*"]
    with pytest.raises(QuineboxError, match="lacks no_such_module_here and its python3 has no pip: use an image that has them"):
        executor.install_packages(["no_such_module_here"])


def test_an_image_without_python_is_refused_in_one_line(test_images):
    from images import NOPYTHON

    with pytest.raises(QuineboxError, match=r"^the box's python3 could not start \(.*exit status 127.*\): use an image with Python 3.8 or later"):
        QuineboxExecutor(image=NOPYTHON.name)


def test_pip_installs_into_the_box_only_with_a_network_grant(engine, tmp_path):
    _pip_image(engine)
    with pytest.raises(QuineboxError, match="has no network to install them: grant the index's hosts"):
        QuineboxExecutor(["tinypkg"], image=PIP_IMAGE)
    index = _index(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(index)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with QuineboxExecutor(["tinypkg"], image=PIP_IMAGE, grants=[f"net:host-loopback:{port}"],
                       pip_options=["--index-url", f"http://host-loopback:{port}/simple", "--trusted-host", "host-loopback"]) as executor:
            assert executor("import tinypkg\ntinypkg.VALUE").output == "installed from the index"
    finally:
        server.shutdown()


def _pip_image(engine) -> None:
    import docker

    try:
        engine.images.get(PIP_IMAGE)
    except docker.errors.ImageNotFound:
        dockerfile = (
            "FROM quinebox/base:bookworm\nRUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            "curl git python3-pip >/dev/null && rm -rf /var/lib/apt/lists/*\n"
        )
        engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=PIP_IMAGE, rm=True)


def _index(root: Path) -> Path:
    """A package index of one wheel, `tinypkg`, in PEP 503's simple layout."""
    write_index(root)
    return root
