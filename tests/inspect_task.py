"""An Inspect AI task whose samples run commands in quinebox sandboxes: tests/integration/test_inspect.py evals it.

`python tests/inspect_task.py CONFIG LOG_DIR [HOLD]` evals it with Inspect's mock model, four samples (and up
to eight commands) at a time. Each sample writes its input into its box, then runs a command there that says
where it ran (pid 1's command line, the uid, the hostname, a file the configured image holds, the sample's own
file); the scorer reads the file back. With HOLD=S each sample first runs `sleep S` in its box, long enough to
kill the eval meanwhile. (The mock model's replies carry their token usage: left to count it, it downloads a
tokenizer.)
"""

import sys
import time

from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import Score, Target, accuracy, scorer
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.util import sandbox

#: What the test's Dockerfile puts in the image, so a sample can show its box runs that image.
IMAGE_MARK = "/etc/inspect-test-image"
#: What a sample says in its place when its image has no such file (one named by `image:`, not built).
NO_MARK = "no-image-mark"
#: What `-T hold=S` runs in each box; the test looks for it among the box's processes.
HOLD_MARK = "inspect-hold-marker"


@solver
def in_box(hold: int):
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box = sandbox()
        if hold:
            await box.exec(["sh", "-c", f"sleep {hold}; : {HOLD_MARK}"])
        await box.write_file("sample.txt", state.input_text)
        began = time.time()
        where = await box.exec(
            ["sh", "-c", f"sleep 1; tr '\\0\\n' '  ' </proc/1/cmdline; echo; id -u; hostname; cat {IMAGE_MARK} 2>/dev/null || echo {NO_MARK}; cat sample.txt"]
        )
        state.metadata["where"] = {"returncode": where.returncode, "stdout": where.stdout, "stderr": where.stderr}
        state.metadata["span"] = [began, time.time()]
        state.metadata["connection"] = (await box.connection()).command
        return await generate(state)

    return solve


@scorer(metrics=[accuracy()])
def read_back():
    async def score(state: TaskState, target: Target) -> Score:
        written = await sandbox().read_file("sample.txt")
        return Score(value=1 if written == target.text else 0, answer=written)

    return score


@task
def quinebox_task(config: str, samples: int = 4, hold: int = 0) -> Task:
    return Task(
        dataset=[Sample(id=f"s{i}", input=f"sample number {i}", target=f"sample number {i}") for i in range(samples)],
        solver=in_box(hold),
        scorer=read_back(),
        sandbox=("quinebox", config),
    )


def reply(*_: object) -> ModelOutput:
    output = ModelOutput.from_content("mockllm/model", "done")
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


if __name__ == "__main__":
    config, log_dir, *hold = sys.argv[1:]
    samples = 3 if hold else 4
    [log] = eval(
        quinebox_task(config, samples=samples, hold=int(hold[0]) if hold else 0),
        model=get_model("mockllm/model", custom_outputs=reply),
        max_samples=4,
        max_subprocesses=8,  # each command running in a box counts as one (default: the CPU count)
        log_dir=log_dir,
        log_format="json",
        display="plain",
    )
    sys.exit(0 if log.status == "success" else 1)
