"""mini-swe-agent's environment as a quinebox box: `environment_class: quinebox.integrations.minisweagent.QuineboxEnvironment`.

mini-swe-agent runs each of its agent's bash actions through an `Environment` (`execute(action, cwd, *, timeout)`,
`get_template_vars`, `serialize`); its `docker` one starts a container that sleeps and `docker exec`s each action.
This one makes a `quinebox.Sandbox` instead — the same hardened box as `quinebox exec` (no root, no network unless
granted, limits, audit) — and runs each action as an exec in it: a fresh `bash -lc` per action, as docker's does,
so nothing but files carries from one action to the next. Its results are docker's to the byte: output is stdout
and stderr as the box wrote them (merged in the box, so in order), a timeout returns returncode -1 with the
output so far and `TimeoutExpired` in `exception_info` (and, unlike `docker exec`'s, kills what the action
started), and output whose first line is `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` raises `Submitted`.

Stands on quinebox's public API alone (tests/unit/test_layout.py). See docs/frameworks/mini-swe-agent.md.
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
import weakref
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from quinebox import ExecResult, QuineboxError, Sandbox

#: What an action's first line of output is when the agent submits (mini-swe-agent's prompts say so).
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: An action's stderr onto its stdout, in the box: one stream in the order written, as docker's `2>&1` gives.
MERGE = ("sh", "-c", 'exec "$@" 2>&1', "sh")
#: The fields of `platform.uname()` mini-swe-agent's templates use (mini.yaml: `{{system}} {{release}} ...`).
UNAME_FIELDS = ("system", "node", "release", "version", "machine")


class QuineboxEnvironmentConfig(BaseModel):
    """mini-swe-agent's DockerEnvironmentConfig's fields where they mean the same, and the box's own."""

    image: str | None = None
    """The box's image; None is quinebox's agent image (Debian with python3). A SWE-bench image works as it is."""
    grants: list[str] = []
    """quinebox grants: `rootfs:rw` (a writable root of the box's own, as benchmark images expect), `net:HOST`,
    `mem:2g`, `cpus:2`, `rw:/host/dir:/box/dir` ... (docs/grants.md). None by default: no network, a read-only root."""
    policy: str | None = None
    """A policy file or name, as `quinebox exec --policy`."""
    cwd: str = ""
    """Where actions run, and the box's working directory; empty is the box's own (its /world)."""
    env: dict[str, str] = {}
    """Environment variables of every action."""
    forward_env: list[str] = []
    """Names of this process's variables each action gets (where set); `env` wins where both name one."""
    timeout: int = 30
    """Seconds an action may take; then its whole process tree is killed and the box stays."""
    interpreter: list[str] = ["bash", "-lc"]
    """What runs an action: the command is its last argument."""
    user: str | None = None
    """Who actions run as: `uid`, `uid:gid` or a user of the image; None is the box's own user."""
    max_output: int = 16 * 1024 * 1024
    """Bytes of an action's output kept; more is cut (and said so in `exception_info`) and never submitted."""
    backend: str | None = None
    """`oci` or `docker`, as --backend; None chooses as the CLI does."""
    runtime: str | None = None
    """`runc` or `runsc` (gVisor), as --runtime."""
    ttl: str | None = None
    """How long the box may live at most (`2h`); None: until `cleanup()` or the end of this process."""
    name: str | None = None
    """What `quinebox box ls` shows for the box."""
    pull: str = "missing"
    """When to pull the image: missing, always or never."""


class QuineboxEnvironment:
    """mini-swe-agent's Environment protocol over one quinebox box, made when this is and removed by `cleanup()`."""

    def __init__(self, *, config_class: type = QuineboxEnvironmentConfig, logger: logging.Logger | None = None, **kwargs: Any):
        """See `QuineboxEnvironmentConfig` for the keyword arguments (the `environment:` section of a config)."""
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self._uname: dict[str, str] | None = None
        c = self.config
        self.sandbox = Sandbox(
            image=c.image, grants=c.grants, policy=c.policy, workdir=c.cwd or None, backend=c.backend, runtime=c.runtime,
            ttl=c.ttl, name=c.name, pull=c.pull,
        )
        # Docker's environment removes its container in __del__; a box closed there hangs once the interpreter is
        # finalizing (the threads that see it end no longer run). A finalizer runs at GC or at exit, before that.
        self._removal = weakref.finalize(self, self.sandbox.close)
        self.logger.info(f"Started quinebox box {self.sandbox.id}")

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]` in the box; `{"output", "returncode", "exception_info"}` as docker's returns."""
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        env = {k: v for k in self.config.forward_env if (v := os.getenv(k)) is not None} | self.config.env
        try:
            result = self.sandbox.exec(
                [*MERGE, *self.config.interpreter, command], cwd=cwd or self.config.cwd or None, env=env, user=self.config.user,
                timeout=limit, max_output=self.config.max_output,
            )
            output = self._output(result, command, limit)
        except (QuineboxError, OSError) as e:  # the box gone or paused: as docker's, the agent sees it and may go on
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        self._check_finished(output)
        return output

    def _output(self, result: ExecResult, command: str, limit: int) -> dict[str, Any]:
        """An exec's result in docker's shape: a timeout as the `subprocess.TimeoutExpired` docker's run raises."""
        text = (result.stdout + result.stderr).decode("utf-8", errors="replace")
        if result.timed_out:
            e = subprocess.TimeoutExpired(command, limit, output=text)
            return {
                "output": text,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        if result.truncated:
            return {
                "output": text,
                "returncode": result.returncode,
                "exception_info": f"The output was cut at {self.config.max_output} bytes (the environment's max_output)",
                "extra": {"truncated": True},
            }
        return {"output": text, "returncode": result.returncode, "exception_info": ""}

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises Submitted if the output says the task is done (as docker's does); never with output cut short."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0 and not output.get("extra", {}).get("truncated"):
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the box's own uname (gVisor's kernel under runsc, not this host's), and `kwargs`."""
        return recursive_merge(self.config.model_dump(), self._box_uname(), kwargs)

    def _box_uname(self) -> dict[str, str]:
        """What `platform.uname()` says inside the box, asked once; this host's where the image has no `uname`."""
        if self._uname is None:
            flags = ("-s", "-n", "-r", "-v", "-m")
            script = "; ".join(f"uname {f}" for f in flags)
            lines = self.sandbox.exec(["sh", "-c", script], timeout=self.config.timeout).stdout.decode(errors="replace").splitlines()
            host = platform.uname()
            self._uname = dict(zip(UNAME_FIELDS, lines, strict=True)) if len(lines) == len(flags) else {k: getattr(host, k) for k in UNAME_FIELDS}
        return self._uname

    def serialize(self) -> dict[str, Any]:
        """The trajectory's record of this environment: docker's shape, and the box's id (`quinebox box ls`, audit)."""
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                },
                "quinebox_box": self.sandbox.id,
            }
        }

    def cleanup(self) -> None:
        """Remove the box and everything running in it (also done when this is collected, or at exit); a second
        call does nothing."""
        self._removal()
