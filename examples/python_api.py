"""The Python API in one page: exec, Popen, run, and a Box fanned out with asyncio.

    .venv/bin/python examples/python_api.py

Uses the scripted models in examples/missions, so it needs no API key.
"""

import asyncio
from pathlib import Path

import quinebox

MISSIONS = Path(__file__).resolve().parent / "missions"
COUNT = f"script:{MISSIONS / 'count-lines.yaml'}"


def main() -> None:
    # A command in a box, like subprocess.run(capture_output=True).
    result = quinebox.exec(["sh", "-c", "tr a-z A-Z; echo note >&2"], input=b"hello\n", grants=["mem:128m"], timeout=30)
    print("exec:", result.returncode, result.stdout, result.stderr)

    # Streaming, like subprocess.Popen.
    with quinebox.Popen(["sed", "-u", "s/^/> /"], stdin=quinebox.PIPE, stdout=quinebox.PIPE) as box:
        box.stdin.write(b"streamed\n")
        print("popen:", box.stdout.readline())
        box.stdin.close()

    # An agent: the mission, the material, the deliverable.
    run = quinebox.run("Count the lines of the material", input=b"a\nb\nc\n", model=COUNT)
    print("run:", run.returncode, run.stdout, run.termination, f"{run.turns} turns, {run.tokens} tokens")

    # Many agents with shared defaults, results as they finish.
    runner = quinebox.Runner(model=COUNT, grants=["mem:256m"], timeout="2m")

    async def fan_out() -> None:
        documents = [b"x\n" * n for n in (3, 1, 2)]
        async for index, result in runner.map("Count the lines of the material", documents, parallel=3):
            print(f"map: document {index}:", result.stdout.decode().strip())

    asyncio.run(fan_out())


if __name__ == "__main__":
    main()
