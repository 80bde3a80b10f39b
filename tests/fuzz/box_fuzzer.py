"""Run inside a box: hostile frames at the host's socket, as many rounds as asked; prints `ok N` when the host held.

    python3 box_fuzzer.py SEED ROUNDS

Each round is a connection: one to five frames of known kinds with fields of
random shape, sometimes cut short, sometimes followed by garbage. Every reply
must be a whole frame of a kind the host sends; the host may close early.
"""

import json
import os
import random
import socket
import struct
import sys

HEADER = struct.Struct(">II")
KINDS = ["hello", "chat", "event", "revise", "restore_world", "adopt", "spawn", "stdin", "kill", "exit", "nonsense"]
FIELDS = ["role", "messages", "tools", "turn", "what", "command", "revision", "session", "force", "argv", "mission", "grants", "cwd", "world", "image", "eof"]
REPLIES = {"welcome", "chat_result", "revised", "error", "world_plan", "world_data", "spawned", "stdout", "stderr", "exit"}


def value(rng, depth=0):
    pick = rng.random()
    if depth > 3 or pick < 0.5:
        return rng.choice([None, True, 0, -1, 2**70, 1.5, "", "x" * rng.randint(0, 300), "/world/../../etc", "inherit", ["a"], {}])
    if pick < 0.75:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(FIELDS): value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def replies(data):
    kinds, at = [], 0
    while at + HEADER.size <= len(data):
        body, payload = HEADER.unpack_from(data, at)
        if at + HEADER.size + body + payload > len(data):
            break
        kinds.append(json.loads(data[at + HEADER.size : at + HEADER.size + body])["kind"])
        at += HEADER.size + body + payload
    return kinds


def main(seed, rounds):
    rng = random.Random(seed)
    for _ in range(rounds):
        frames = b""
        for _ in range(rng.randint(1, 5)):
            message = {rng.choice(FIELDS): value(rng) for _ in range(rng.randint(0, 4))}
            message["kind"] = rng.choice(KINDS)
            body, payload = json.dumps(message).encode(), os.urandom(rng.randint(0, 512))
            frames += HEADER.pack(len(body), len(payload)) + body + payload
        if rng.random() < 0.3:
            frames = frames[: rng.randint(0, len(frames))]
        if rng.random() < 0.2:
            frames += os.urandom(rng.randint(1, 64))
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(30)
        conn.connect("/run/quinebox/host.sock")
        try:
            conn.sendall(frames)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        data = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except ConnectionError:
                break
            if not chunk:
                break
            data += chunk
        conn.close()
        unknown = set(replies(data)) - REPLIES
        if unknown:
            print(f"host sent {unknown}")
            return 1
    print(f"ok {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
