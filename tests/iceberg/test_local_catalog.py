"""The embedded catalog's SQLite file opened by several parties at once (real SQLite, no
Spark): a follower's Spark JDBC connection creating the catalog while the follower itself,
`iceberg status` or a test open it through ``LocalCatalog.prepare``."""

from __future__ import annotations

import sqlite3
import threading
import time

from rsm_sidecar.iceberg.session.catalogs import LocalCatalog


def test_catalogs_opened_at_once_on_a_new_file_all_switch_it_to_wal(tmp_path):
    """On a new file in rollback-journal mode, connections switching it to WAL at the same time
    can deadlock on the lock upgrade, and SQLite then answers "database is locked" at once,
    whatever the busy timeout (CI failed a follow test on it: the test's own catalog read lost
    the race to the follower's). ``prepare`` tries again until its lock wait is over; the old
    single attempt failed about 5 times in 1,200 of these opens."""
    failures: list[str] = []
    for i in range(300):
        catalog = LocalCatalog(tmp_path / f"c{i}")
        catalog.db_file.parent.mkdir(parents=True)
        # the file exists in rollback mode, made by another writer (Spark's JDBC catalog tables)
        writer = sqlite3.connect(catalog.db_file, isolation_level=None)
        writer.execute("CREATE TABLE t(i)")

        def prepare(catalog: LocalCatalog = catalog) -> None:
            try:
                catalog.prepare()
            except sqlite3.OperationalError as e:
                failures.append(f"{catalog.db_file}: {e}")

        threads = [threading.Thread(target=prepare) for _ in range(4)]
        for t in threads:
            t.start()
        writer.execute("BEGIN")  # and a reader holding its shared lock for a moment
        writer.execute("SELECT * FROM t").fetchall()
        time.sleep(0.001)
        writer.execute("COMMIT")
        for t in threads:
            t.join()
        writer.close()
        con = sqlite3.connect(catalog.db_file)
        try:
            assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            con.close()
    assert failures == []


def test_a_lock_held_past_the_wait_is_an_error_and_one_let_go_in_time_is_waited_for(tmp_path, monkeypatch):
    """A writer holding the file past the lock wait ends in SQLite's own error, not a hang;
    one that lets go in time is waited for."""
    import rsm_sidecar.iceberg.session.catalogs as catalogs

    monkeypatch.setattr(catalogs, "LOCK_WAIT_S", 1.0)
    catalog = LocalCatalog(tmp_path / "c")
    catalog.db_file.parent.mkdir(parents=True)
    writer = sqlite3.connect(catalog.db_file, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE t(i)")
    writer.execute("BEGIN EXCLUSIVE")
    t0 = time.monotonic()
    try:
        catalog.prepare()
    except sqlite3.OperationalError as e:
        assert "locked" in str(e)
    else:
        raise AssertionError("prepare() switched a file another connection holds exclusively")
    assert 0.9 < time.monotonic() - t0 < 10
    threading.Timer(0.3, lambda: writer.execute("COMMIT")).start()
    try:
        catalog.prepare()  # waits for the commit
    finally:
        time.sleep(0.4)
        writer.close()
    con = sqlite3.connect(catalog.db_file)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
