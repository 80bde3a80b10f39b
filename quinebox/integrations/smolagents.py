"""smolagents' remote Python executor, in a quinebox box: `CodeAgent(tools=[], model=m, executor=QuineboxExecutor())`.

smolagents runs a CodeAgent's code actions through a `RemotePythonExecutor`; its Docker executor keeps one Jupyter
kernel per agent, so a variable, an import or a function one action made is there for the next. This one keeps
the same state with no kernel, no server and no port: one Python process in the box, started once through
`Sandbox.Popen`, runs each action in one namespace and answers over its own stdin and stdout in length-framed
JSON (smolagents_interpreter.py: stdlib only, its source given to the box's `python3 -c`, so any image with a Python serves).
Everything the actions print (their subprocesses' output too) is captured at the file descriptors, bounded; the
last expression's value comes back as smolagents' local executor gives it (the value where it is plain JSON,
else its repr), an exception as the agent's error, and `final_answer(...)` through the FinalAnswerException
smolagents patches into its tool for remote executors. The box is untrusted: what it answers is read within a
byte cap and a deadline, never unpickled unless the caller set smolagents' own `allow_pickle`.
"""

from __future__ import annotations

import ast
import json
import math
import os
import select
import shlex
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.tools import Tool
from smolagents.utils import AgentError

from quinebox import PIPE, QuineboxError, Sandbox

#: The in-box side (smolagents_interpreter.py), run as `python3 -c SOURCE CAP SITE`.
DRIVER = (Path(__file__).parent / "smolagents_interpreter.py").read_text()

#: What the box's answers may hold beyond the output cap (a traceback, the value, the framing) before they are refused.
ANSWER_SLACK = 1 << 20
#: How long the host waits past an action's own timeout (the in-box interrupt's turn) before it kills the interpreter.
KILL_GRACE = 5.0
#: How long an interpreter that closed its answers may take to end before it is killed.
ENDING = 5.0
#: How long the interpreter may take to start and say hello.
START_TIMEOUT = 30.0


class InterpreterLost(QuineboxError):
    """The box's interpreter ended or broke the protocol: the next action starts a new one."""


class QuineboxExecutor(RemotePythonExecutor):
    """Runs a CodeAgent's code actions in one Python process in a quinebox box, its state kept between them.

    `sandbox`: a box of the caller's (kept open by `cleanup`); else one is made from `image`, `grants` and the
    other `Sandbox` options, and `cleanup` removes it. `timeout`: seconds an action may run before it is
    interrupted in the box (its variables kept), None for no bound; `max_output`: the bytes of an action's
    output kept (its head and tail). `pip_options`: extra `pip install` arguments (an index of your own).
    """

    def __init__(
        self,
        additional_imports: Sequence[str] = (),
        logger: AgentLogger | None = None,
        allow_pickle: bool = False,
        *,
        sandbox: Sandbox | None = None,
        image: str | None = None,
        grants: Iterable[str] = (),
        python: str = "python3",
        timeout: float | None = 300.0,
        max_output: int = 1 << 20,
        pip_options: Sequence[str] = (),
        **sandbox_options: Any,
    ):
        super().__init__(list(additional_imports), logger or AgentLogger(level=LogLevel.INFO), allow_pickle)
        self.python, self.timeout, self.max_output, self.pip_options = python, timeout, max_output, list(pip_options)
        self._grants = None if sandbox is not None else list(grants)
        self._owned = sandbox is None
        self.sandbox: Sandbox = sandbox if sandbox is not None else Sandbox(image=image, grants=self._grants, **sandbox_options)
        self._lock = threading.RLock()
        self._proc: Any = None  # the interpreter: a Sandbox.Popen
        self._buffer = b""
        self._preamble: list[str] | None = None  # the tools' and variables' code, run again in a new interpreter
        self._replay: list[str] = []
        self._optional = False  # install_packages for the tools' requirements (send_tools): warn, not fail
        try:
            self._start()
            self.installed_packages = self.install_packages(self.additional_imports)
        except BaseException:
            self.cleanup()
            raise
        self.logger.log(f"quinebox box {self.sandbox.id} runs the code actions", level=LogLevel.INFO)

    # -- the executor's contract ------------------------------------------------------------------

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """One code action in the interpreter's namespace: its logs, its last expression's value, or its final
        answer; an exception in the code raises AgentError with its traceback (what the agent shows its model)."""
        with self._lock:
            if self._preamble is not None:
                code = tolerant_imports(code) if self._optional else code
                self._preamble.append(code)
            try:
                if self._proc is None:
                    self._start()
                answer = self._ask({"op": "run", "code": code, "timeout": self.timeout}, None if self.timeout is None else self.timeout + KILL_GRACE)
            except InterpreterLost as lost:
                raise AgentError(f"{lost}; the next code action runs in a new interpreter (with the tools) where the variables of earlier ones are gone", self.logger) from None
            except TimeoutError:
                self._stop()
                raise AgentError(
                    f"the code action ran longer than {self.timeout} s and did not stop when interrupted: its interpreter was killed, "
                    "and the next one runs in a new interpreter (with the tools) where the variables of earlier ones are gone",
                    self.logger,
                ) from None
        logs = str(answer.get("logs", ""))
        kind = answer.get("kind")
        if kind == "final":
            return CodeOutput(output=self._deserialize_final_answer(str(answer.get("value")), self.allow_pickle), logs=logs, is_final_answer=True)
        if kind == "error":
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{answer.get('name')}\n{answer.get('value')}\n{answer.get('traceback')}", self.logger)
        if kind == "value":
            return CodeOutput(output=answer["json"] if "json" in answer else answer.get("repr"), logs=logs, is_final_answer=False)
        return CodeOutput(output=None, logs=logs, is_final_answer=False)

    def send_tools(self, tools: dict[str, Tool]) -> None:
        """The base's (the final answer's patch, the tools' requirements, the tools' code), remembered so a new
        interpreter gets them again. A requirement the box cannot get is a warning here, not an error: smolagents
        lists numpy and pillow for its patched final answer, which uses them only where they are, and hoists their
        imports to the top of the tools' code: there a module the box lacks is skipped (`tolerant_imports`), and a
        tool that does need one fails in the box when called, which the agent sees."""
        self._optional = True
        try:
            self._recording(super().send_tools, tools)
        finally:
            self._optional = False

    def send_variables(self, variables: dict[str, Any]) -> None:
        self._recording(super().send_variables, variables)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Make importable in the box what smolagents asks for (the agent's authorized imports, the tools'
        requirements). What the box's Python has already needs nothing; the rest is `pip install --target` into a
        directory on the interpreter's path, which needs pip in the image and a network grant to reach an index
        (`net:pypi.org`, `net:files.pythonhosted.org`, or your own through `pip_options`): without either,
        one QuineboxError line says so, at once (for the tools' requirements, one warning line in the log)."""
        wanted = sorted({name.removesuffix(".*") for name in additional_imports if name and name != "*"})
        if not wanted:
            return list(additional_imports)
        probe = self.sandbox.exec([self.python, "-c", PROBE, *wanted], timeout=60, max_output=1 << 20)
        if probe.returncode != 0:
            raise QuineboxError(f"could not look for {', '.join(wanted)} in the box's {self.python}: {_last_line(probe.stderr)}")
        missing, has_pip = json.loads(probe.stdout)
        if missing:
            why = None
            if not has_pip:
                why = f"the box lacks {', '.join(missing)} and its {self.python} has no pip: use an image that has them (image=...)"
            elif self._grants is not None and not any(grant.startswith("net:") for grant in self._grants):
                why = (
                    f"the box lacks {', '.join(missing)} and has no network to install them: "
                    "grant the index's hosts (grants=['net:pypi.org', 'net:files.pythonhosted.org']) or use an image that has them"
                )
            if why is not None and self._optional:
                self.logger.log(f"quinebox: {why}", level=LogLevel.INFO)
                return []
            if why is not None:
                raise QuineboxError(why)
            argv = [self.python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet", "--target", SITE_PATH, *self.pip_options, *missing]
            installed = self.sandbox.exec(argv, timeout=600, max_output=1 << 20)
            if installed.returncode != 0:
                raise QuineboxError(f"`{shlex.join(argv)}` failed in the box ({installed.returncode}): {_last_line(installed.stderr)}")
            with self._lock:
                if self._proc is not None:
                    self._ask({"op": "refresh"}, START_TIMEOUT)
            self.logger.log(f"installed {', '.join(missing)} in the box", level=LogLevel.INFO)
        return list(additional_imports)

    def cleanup(self) -> None:
        """End the interpreter, and the box if this executor made it; a second call does nothing."""
        with self._lock:
            self._stop()
            if self._owned:
                self.sandbox.close()

    def delete(self) -> None:
        self.cleanup()

    def __enter__(self) -> QuineboxExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- the interpreter ---------------------------------------------------------------------------

    def _recording(self, send: Any, what: Any) -> None:
        with self._lock:
            self._preamble = []
            try:
                send(what)
            finally:
                self._replay += [code for code in self._preamble if code not in self._replay]
                self._preamble = None

    def _start(self) -> None:
        """A new interpreter; the tools and variables sent to the last one (if any) defined again in it."""
        self._buffer = b""
        self._proc = self.sandbox.Popen([self.python, "-c", DRIVER, str(self.max_output), SITE_PATH], stdin=PIPE, stdout=PIPE, stderr=PIPE)
        try:
            hello = self._receive(START_TIMEOUT)
        except (InterpreterLost, TimeoutError) as lost:
            self._stop()
            raise InterpreterLost(
                f"the box's {self.python} could not start ({lost or 'no answer in time'}): "
                "use an image with Python 3.8 or later (image=...), or name its interpreter (python=...)"
            ) from None
        if hello.get("kind") != "hello":
            raise self._lost("the box's interpreter did not start")
        for code in self._replay:
            answer = self._ask({"op": "run", "code": code, "timeout": self.timeout}, None if self.timeout is None else self.timeout + KILL_GRACE)
            if answer.get("kind") == "error":
                raise self._lost(f"the tools could not be defined again in a new interpreter: {answer.get('name')}: {answer.get('value')}")

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait_drained(10)  # killed above: its end, or 124 past the grace, never a raise
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()

    def _ask(self, request: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send one request (by the same deadline: an interpreter that stops reading cannot hold us) and read its answer."""
        deadline = None if timeout is None else time.monotonic() + timeout
        data = json.dumps(request).encode()
        data = b"%d\n" % len(data) + data
        fd = self._proc.stdin.fileno()
        os.set_blocking(fd, False)
        while data:
            _wait_for(fd, select.POLLOUT, deadline)
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                continue
            except OSError:
                raise self._lost("the box's interpreter stopped reading") from None
        return self._receive(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _receive(self, timeout: float | None) -> dict[str, Any]:
        """One framed answer, read within the byte cap and by the deadline (TimeoutError; the caller kills)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        limit = 2 * self.max_output + ANSWER_SLACK
        fd = self._proc.stdout.fileno()
        while True:
            header, newline, rest = self._buffer.partition(b"\n")
            if newline:
                if not header.isdigit() or int(header) > limit:
                    raise self._lost("the box's interpreter broke the protocol (a bad or too long answer)")
                if len(rest) >= int(header):
                    self._buffer = rest[int(header):]
                    try:
                        answer = json.loads(rest[: int(header)])
                    except ValueError:
                        raise self._lost("the box's interpreter answered what is not JSON") from None
                    if not isinstance(answer, dict):
                        raise self._lost("the box's interpreter answered what is not an object")
                    return answer
            elif len(header) > 20:
                raise self._lost("the box's interpreter broke the protocol (no length)")
            _wait_for(fd, select.POLLIN, deadline)
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._lost("the box's interpreter ended", ended=True)
            self._buffer += chunk

    def _lost(self, what: str, *, ended: bool = False) -> InterpreterLost:
        """Kill what is left of the interpreter (`ended`: it closed its answers, so its exit status is a moment away);
        the error says how it went (its exit status, its last words)."""
        proc, why = self._proc, ""
        if proc is not None:
            if not ended and proc.poll() is None:
                proc.kill()
            why = f" (exit status {proc.wait_drained(ENDING)})"
            said_poll = select.poll()
            said_poll.register(proc.stderr.fileno(), select.POLLIN)
            if said_poll.poll(0):
                said = os.read(proc.stderr.fileno(), 4096).decode(errors="replace").strip()
                why += f": {said.splitlines()[-1]}" if said else ""
        self._stop()
        return InterpreterLost(f"{what}{why}")


#: Where `install_packages` puts what pip installs (the interpreter puts it on its path): under the box's /tmp.
SITE_PATH = "/tmp/.quinebox-smolagents-site"

#: Which of argv's names the box's Python lacks (neither a module nor an installed distribution, where pip puts
#: them too) and whether it has pip: one JSON line.
PROBE = f"""
import importlib.util, importlib.metadata, json, sys
sys.path.append({SITE_PATH!r})
def has(name):
    try:
        if importlib.util.find_spec(name) is not None:
            return True
    except (ImportError, ValueError):
        pass
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
print(json.dumps([[n for n in sys.argv[1:] if not has(n)], has("pip")]))
"""


def tolerant_imports(code: str) -> str:
    """`code` with each one-line `import`/`from ... import` at its top level made `try: ... except ImportError: pass`:
    how the tools' code smolagents writes (its imports hoisted out of the methods that guard them) runs in a box
    that lacks an optional module."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return code  # the box says what is wrong with it
    lines = code.splitlines()
    for node in reversed(body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset == 0 and node.end_lineno == node.lineno:
            line = lines[node.lineno - 1]
            lines[node.lineno - 1 : node.lineno] = ["try:", f"    {line}", "except ImportError:", "    pass"]
    return "\n".join(lines) + "\n"


def _wait_for(fd: int, event: int, deadline: float | None) -> None:
    """Return once `fd` is ready for `event` (or at its end); TimeoutError once `deadline` has passed (after a last look)."""
    poller = select.poll()
    poller.register(fd, event)
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if poller.poll(None if left is None else math.ceil(left * 1000)):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "(it said nothing)"
