"""What the broker adds to a model call, and what an agent costs over a plain box.

    .venv/bin/python bench/broker.py [--calls 200] [--runs 20]

1. One chat call through the broker (guest frames over the box's Unix socket →
   session: budgets, tape fsyncs → openai client → server) vs the same call
   straight from the openai client to the same loopback server.   target: ≤ 2 ms added (median)
2. `quinebox run` of a one-turn mission against that server vs `quinebox exec -- true`.
   target: ≤ 300 ms more (median)

Pairs are interleaved; medians are quoted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from measure import run_child  # noqa: E402
from openai_server import FakeOpenAI, exit_  # noqa: E402

from quinebox.agent.budgets import Budget  # noqa: E402
from quinebox.agent.providers.openai import OpenAIProvider  # noqa: E402
from quinebox.agent.session import AgentSession  # noqa: E402
from quinebox.box.net.broker import Broker  # noqa: E402
from quinebox.guest import protocol  # noqa: E402

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))
MESSAGES = [{"role": "system", "content": "You are a benchmark."}, {"role": "user", "content": "Begin."}]
TOOLS = [{"type": "function", "function": {"name": "exit", "parameters": {"type": "object", "properties": {}}}}]


def bench_calls(server: FakeOpenAI, calls: int) -> float:
    direct = openai.OpenAI(base_url=server.url, api_key="sk-bench", max_retries=0)
    provider = OpenAIProvider("bench", api_key="sk-bench", base_url=server.url, max_retries=0)
    session = AgentSession(f"bench-{os.getpid()}-{time.time_ns()}", mission="bench", provider=provider, budget=Budget(max_turns=10**9))
    path = os.path.join(tempfile.mkdtemp(prefix="quinebox-bench-"), "box.sock")
    broker = Broker(path, session)
    guest = socket.socket(socket.AF_UNIX)
    guest.connect(path)
    reader = guest.makefile("rb")
    frame = protocol.encode({"kind": "chat", "messages": MESSAGES, "tools": TOOLS})

    def through_broker() -> None:
        guest.sendall(frame)
        reply, _ = protocol.read_frame(reader)
        assert reply["kind"] == "chat_result", reply

    def straight() -> None:
        direct.chat.completions.create(model="bench", messages=MESSAGES, tools=TOOLS)

    for _ in range(10):  # warm both paths: connections, imports
        through_broker()
        straight()
    ours, theirs = [], []
    for _ in range(calls):
        began = time.perf_counter()
        through_broker()
        ours.append(time.perf_counter() - began)
        began = time.perf_counter()
        straight()
        theirs.append(time.perf_counter() - began)
    broker.close()
    session.finish(0)
    added = (statistics.median(ours) - statistics.median(theirs)) * 1000
    print(f"{'model call: through the broker vs direct':<48} broker {statistics.median(ours) * 1000:6.2f} ms   direct {statistics.median(theirs) * 1000:6.2f} ms   added {added:5.2f} ms  (target ≤ 2 ms)")
    return added


def bench_mission(server: FakeOpenAI, runs: int) -> float:
    env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "sk-bench", "QUINEBOX_MODEL": "bench"}
    mission, box = [], []
    for _ in range(runs):
        mission.append(run_child([QUINEBOX, "run", "-q", "finish at once"], env=env).seconds)
        box.append(run_child([QUINEBOX, "exec", "--", "true"], env=env).seconds)
    more = (statistics.median(mission) - statistics.median(box)) * 1000
    print(f"{'one-turn mission vs quinebox exec -- true':<48} run {statistics.median(mission) * 1000:7.1f} ms   exec {statistics.median(box) * 1000:7.1f} ms   more {more:6.1f} ms  (target ≤ 300 ms)")
    return more


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    server = FakeOpenAI(steps=[exit_()])
    try:
        print(f"{args.calls} model calls and {args.runs} runs per side, medians\n")
        added = bench_calls(server, args.calls)
        more = bench_mission(server, args.runs)
    finally:
        server.close()
    met = added <= 2 and more <= 300
    print("\nall targets met" if met else "\nSOME TARGETS MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
