"""Soak: 2,000 boxes through `quinebox.exec` at 16 at a time, then 100 held open for a minute.

    .venv/bin/python bench/soak.py [--boxes 2000] [--parallel 16] [--held 100] [--hold 60]

Afterwards nothing may be left: no container, volume, session directory,
socket, file descriptor or thread; and this process's RSS may grow by less
than 10 MB from the first hundred boxes to the last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from soak import soak  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=16)
    parser.add_argument("--held", type=int, default=100)
    parser.add_argument("--hold", type=float, default=60)
    args = parser.parse_args()
    report = soak(args.boxes, args.parallel, args.held, args.hold)
    growth_mb = (report.rss_kib[-1] - report.rss_kib[0]) / 1024 if len(report.rss_kib) > 1 else 0.0
    print(f"{report.boxes} boxes at {args.parallel} at a time, then {args.held} held {args.hold:g} s: {report.seconds:.1f} s, {report.failed} failed")
    print(f"RSS after each hundred (MB): {' '.join(f'{k / 1024:.1f}' for k in report.rss_kib)}")
    print(f"RSS growth, first hundred to last: {growth_mb:+.1f} MB  (target < 10 MB)")
    print(f"before: {report.before}\nafter:  {report.after}")
    met = report.failed == 0 and report.after.none_beyond(report.before) and growth_mb < 10
    print("all targets met" if met else "SOME TARGETS MISSED")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
