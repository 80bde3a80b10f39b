"""What the audit log adds to a box that asks for nothing, side by side in one run.

    .venv/bin/python bench/audit.py [--runs 30]

1. quinebox.exec(["true"]) with the audit log vs with QUINEBOX_AUDIT=off, interleaved in
   pairs (the order alternating), medians of each side and of the paired differences.
2. The time spent inside the audit log's appends during each audited exec (the records of
   one box: created and ended), measured around the appends themselves. target ≤ 2 ms

A container start varies by tens of milliseconds here, so (1) shows that nothing visible
changed and (2) is the figure held to the target.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import quinebox
from quinebox.audit import log


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs

    spent: list[float] = []
    append = log.AuditLog.append

    def timed_append(self, *args, **facts):
        began = time.perf_counter()
        try:
            return append(self, *args, **facts)
        finally:
            spent.append(time.perf_counter() - began)

    log.AuditLog.append = timed_append  # type: ignore[method-assign]
    quinebox.exec(["true"])  # warm: image, runtime, imports
    on: list[float] = []
    off: list[float] = []
    per_box: list[float] = []
    for index in range(runs):
        for audited in ((True, False) if index % 2 == 0 else (False, True)):
            os.environ["QUINEBOX_AUDIT"] = "on" if audited else "off"
            del spent[:]
            began = time.perf_counter()
            result = quinebox.exec(["true"])
            took = time.perf_counter() - began
            assert result.returncode == 0, result.stderr
            (on if audited else off).append(took)
            if audited:
                per_box.append(sum(spent))
                assert len(spent) == 2, f"expected the box's two records, saw {len(spent)}"
    os.environ.pop("QUINEBOX_AUDIT")
    pairs = [a - b for a, b in zip(on, off)]
    ms = 1000.0
    print(f"exec(['true']) audited   median {statistics.median(on) * ms:7.1f} ms   not audited {statistics.median(off) * ms:7.1f} ms   ({runs} pairs, interleaved)")
    print(f"paired difference        median {statistics.median(pairs) * ms:+7.2f} ms   (noise: stdev of the unaudited side {statistics.stdev(off) * ms:.1f} ms)")
    print(f"audit appends per exec   median {statistics.median(per_box) * ms:7.3f} ms   p95 {sorted(per_box)[int(len(per_box) * 0.95) - 1] * ms:.3f} ms   (target ≤ 2 ms)")


if __name__ == "__main__":
    main()
