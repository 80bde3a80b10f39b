"""The sessions index opened by many at once on a fresh state dir, as `map` starts its first agents: every open succeeds.

Without opening one at a time, about one fresh state dir in twenty here had an
open fail with "database is locked" (the switch to WAL does not wait).
"""

import threading

from quinebox.agent.store import Index


def test_first_opens_at_once_all_succeed(tmp_path, monkeypatch):
    failed = 0
    for attempt in range(150):
        monkeypatch.setenv("QUINEBOX_STATE_DIR", str(tmp_path / f"fresh{attempt}"))
        errors: list[BaseException] = []
        together = threading.Barrier(6)

        def open_and_write(number: int) -> None:
            together.wait()
            try:
                Index().start(f"s{number}", parent=None, mission="m", model="script:x")
            except Exception as exc:  # noqa: BLE001 - counted and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=open_and_write, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed += bool(errors)
    assert failed == 0
