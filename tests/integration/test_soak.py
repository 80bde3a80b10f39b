"""A short soak: boxes through one process, then a crowd at once; nothing is left and memory stays flat.

bench/soak.py runs the long one (2,000 boxes at 16 at a time, 100 held for a minute).
"""

from soak import soak


def test_a_short_soak_leaves_nothing_behind(engine):
    report = soak(total=120, parallel=8, held=12, hold_s=3, every=40)
    assert report.failed == 0
    assert report.after.none_beyond(report.before), (report.before, report.after)  # containers, volumes, session dirs, sockets, fds, threads
    assert report.rss_kib[-1] - report.rss_kib[0] < 10 * 1024, report.rss_kib
