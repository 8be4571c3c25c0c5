#!/usr/bin/env python3
"""psycopg 3 threads through a DSN, as issue 12 reported them failing
through pgtender: "84 of 800 transactions failed (37
DuplicatePreparedStatement 42P05, 47 InvalidSqlStatementName 26000)".

Usage: psycopg3_check.py DSN PREPARE_THRESHOLD THREADS TRANSACTIONS

PREPARE_THRESHOLD is "default" (psycopg's 5: a query is prepared as a named
statement, _pg3_N, on its fifth execution on a connection), a number (0:
every query is prepared at once), or "none" (never prepared).

Each thread has its own connection (not autocommit, psycopg's default) and
runs TRANSACTIONS transactions of four statements: a parameterized SELECT,
an INSERT, a count of its own rows, and a SELECT of a parameter as text,
then COMMIT; every tenth transaction is rolled back instead, after which
psycopg forgets what it prepared and sends DEALLOCATE ALL (so at the default
threshold each query is prepared again on its sixth transaction after a
rollback). Failed transactions are rolled back and counted by exception
class and SQLSTATE.

Every line starts with "check:", "observe:", "error:" or is the final summary
"psycopg3 prepare_threshold=P: T transactions, E errors". Exits 1 if E > 0.
"""

import collections
import sys
import threading

import psycopg

TABLE = "drivers_psycopg3"


class Mismatch(Exception):
    pass


def expect(what, got, want):
    if got != want:
        raise Mismatch("%s: got %r, want %r" % (what, got, want))


def worker(dsn, threshold, tid, transactions, failures, lock, first_errors, prepared):
    kwargs = {} if threshold == "default" else {"prepare_threshold": None if threshold == "none" else int(threshold)}
    try:
        conn = psycopg.connect(dsn, **kwargs)
    except psycopg.Error as e:
        with lock:
            failures[(type(e).__name__, e.sqlstate or "-")] += transactions
            first_errors.append("thread %d: connect: %s" % (tid, e))
        return
    committed = 0
    try:
        for i in range(transactions):
            try:
                cur = conn.cursor()
                expect("sum", cur.execute("SELECT %s::int + %s::int", (tid, i)).fetchone(), (tid + i,))
                cur.execute("INSERT INTO " + TABLE + " (thread, n) VALUES (%s, %s)", (tid, i))
                expect("own rows", cur.execute("SELECT count(*) FROM " + TABLE + " WHERE thread = %s", (tid,)).fetchone(),
                       (committed + 1,))
                expect("text", cur.execute("SELECT %s::text", ("t%d-%d" % (tid, i),)).fetchone(), ("t%d-%d" % (tid, i),))
                if i % 10 == 9:
                    conn.rollback()
                else:
                    conn.commit()
                    committed += 1
            except (psycopg.Error, Mismatch) as e:
                code = getattr(e, "sqlstate", None) or "-"
                with lock:
                    failures[(type(e).__name__, code)] += 1
                    if len(first_errors) < 10:
                        first_errors.append("thread %d transaction %d: %s %s: %s" % (tid, i, type(e).__name__, code, str(e).strip()))
                try:
                    conn.rollback()
                except psycopg.Error:
                    pass
    finally:
        # How many named statements psycopg prepared on this connection
        # (its own counter, _pg3_N; the same both ways).
        with lock:
            prepared[conn._prepared._prepared_idx] += 1
        conn.close()


def main():
    if len(sys.argv) != 5:
        print("usage: psycopg3_check.py DSN PREPARE_THRESHOLD THREADS TRANSACTIONS", file=sys.stderr)
        return 2
    dsn, threshold, threads, per_thread = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    label = "5" if threshold == "default" else threshold
    print("check: psycopg %s, libpq %s" % (psycopg.__version__, psycopg.pq.version()))
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS " + TABLE)
        setup.execute("CREATE TABLE " + TABLE + " (thread int, n int)")

    failures = collections.Counter()
    first_errors = []
    prepared = collections.Counter()
    lock = threading.Lock()
    pool = [threading.Thread(target=worker, args=(dsn, threshold, tid, per_thread, failures, lock, first_errors, prepared))
            for tid in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    total = threads * per_thread
    failed = sum(failures.values())
    for line in first_errors:
        print("error: " + line)
    if failed:
        kinds = ", ".join("%d %s %s" % (n, name, code) for (name, code), n in sorted(failures.items()))
        print("error: %d of %d transactions failed (%s)" % (failed, total, kinds))

    with psycopg.connect(dsn, autocommit=True) as setup:
        rows = setup.execute("SELECT count(*) FROM " + TABLE).fetchone()[0]
        setup.execute("DROP TABLE " + TABLE)
    print("observe: committed_rows=%d" % rows)
    print("observe: named_statements_prepared=%s" % ", ".join("%d connections prepared %d" % (n, k) for k, n in sorted(prepared.items())))
    print("check: %d threads x %d transactions (SELECT, INSERT, count, SELECT; every tenth rolled back), prepare_threshold=%s"
          % (threads, per_thread, label))
    print("psycopg3 prepare_threshold=%s: %d transactions, %d errors" % (label, total, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
