"""Egress through the host's proxy vs the same box on the engine's bridge, side by side in one run.

    .venv/bin/python bench/egress.py [--mib 200] [--runs 3] [--requests 100]

A server container on the engine's default bridge serves MIB of bytes from a
file with sendfile (as nginx would) and a tiny page. Inside a box, a Python client downloads it through HTTP_PROXY
(grant net:CIDR of the bridge) or directly (net:bridge), and times itself:

1. throughput, proxy / bridge.                               target ≥ 0.8
2. time to first byte added per new connection (median of REQUESTS fresh
   connections, each a full request of the tiny page).      target ≤ 5 ms
3. host RSS per box with the proxy: the peak RSS of `quinebox exec` while the
   proxied download runs, less the same on the bridge.      target ≤ 10 MB

Runs are interleaved so drift hits both sides alike; medians are quoted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import docker
from measure import run_child

from quinebox.box.spec import DEFAULT_IMAGE

QUINEBOX = str(Path(sys.executable).with_name("quinebox"))

SERVER = """
import http.server, os
MIB = int(os.environ["MIB"])
with open("/tmp/big", "wb") as f:
    for _ in range(MIB): f.write(b"x" * (1 << 20))
class Serve(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        size = (MIB << 20) if self.path == "/big" else 16
        self.send_response(200); self.send_header("Content-Length", str(size)); self.end_headers(); self.wfile.flush()
        if size == 16:
            self.wfile.write(b"x" * 16)
            return
        with open("/tmp/big", "rb") as f:
            sent = 0
            while sent < size: sent += os.sendfile(self.connection.fileno(), f.fileno(), sent, size - sent)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("", 8000), Serve).serve_forever()
"""

CLIENT = """
import statistics, sys, time, urllib.request
url, requests = sys.argv[1], int(sys.argv[2])
opener = urllib.request.build_opener()
began = time.perf_counter(); total = 0
buffer = bytearray(8 << 20)
with opener.open(url + "/big") as r:
    while size := r.readinto(buffer): total += size
seconds = time.perf_counter() - began
firsts = []
for _ in range(requests):
    began = time.perf_counter()
    with opener.open(url + "/small") as r: r.read(1)
    firsts.append(time.perf_counter() - began)
print(total / seconds / (1 << 20), statistics.median(firsts) * 1000)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    client = docker.from_env()
    server = client.containers.run(DEFAULT_IMAGE, ["python3", "-c", SERVER], environment={"MIB": str(args.mib)}, detach=True, network="bridge", user="1000")
    try:
        server.reload()
        address = server.attrs["NetworkSettings"]["IPAddress"]
        subnet = client.api.inspect_network("bridge")["IPAM"]["Config"][0]["Subnet"]
        server.exec_run(["python3", "-c", "import socket,time\nfor _ in range(100):\n try: socket.create_connection(('127.0.0.1', 8000), 1).close(); break\n except OSError: time.sleep(0.1)"])
        url = f"http://{address}:8000"
        figures: dict[str, list[tuple[float, float, int]]] = {"proxy": [], "bridge": []}
        for _ in range(args.runs):
            for side, grant in (("proxy", f"net:{subnet}"), ("bridge", "net:bridge")):
                out = Path("/tmp/quinebox-bench-egress.out")
                with open(out, "wb") as sink:
                    measured = run_child([QUINEBOX, "exec", "-g", grant, "--", "python3", "-c", CLIENT, url, str(args.requests)], stdout=sink).peak_kib
                mib_s, first_ms = (float(x) for x in out.read_text().split())
                figures[side].append((mib_s, first_ms, measured))
                print(f"{side:6}  {mib_s:8.1f} MiB/s  first byte {first_ms:6.2f} ms  host peak RSS {measured / 1024:6.1f} MB", flush=True)
        median = {side: [statistics.median(run[i] for run in runs) for i in range(3)] for side, runs in figures.items()}
        print(f"\nthroughput proxy/bridge: {median['proxy'][0] / median['bridge'][0]:.2f}  (target ≥ 0.8)")
        print(f"first byte added per connection: {median['proxy'][1] - median['bridge'][1]:.2f} ms  (target ≤ 5 ms)")
        print(f"host RSS added per box by the proxy: {(median['proxy'][2] - median['bridge'][2]) / 1024:.1f} MB  (target ≤ 10 MB)")
    finally:
        server.remove(force=True)


if __name__ == "__main__":
    main()
