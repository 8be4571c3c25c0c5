#!/usr/bin/env python3
"""Connection-per-request psycopg2 client for pgtender's integration tests.

Usage: psycopg2_check.py DSN [CONNECTIONS]

Opens and closes CONNECTIONS connections (default 200), as a Django fleet with
CONN_MAX_AGE=0 does, and on each one runs: a parameterized query (psycopg2
interpolates parameters on the client and sends a simple-protocol Query), a
transaction with INSERT + SELECT + ROLLBACK, a server-side error followed by
rollback and a working query, and SET TIME ZONE inside a transaction.

Then it looks at session state set outside a transaction (which pgtender does
not carry across server connections yet, docs/pooling.md) and prints what it
saw as "observe: key=value" lines, the same against pgtender and against
Postgres, so that the Go test can compare the two runs.

Every line it prints starts with "check:", "observe:", "error:" or is the final
summary "psycopg2: N connections, E errors". Exits 1 if E > 0.
"""

import sys
from decimal import Decimal

import psycopg2
import psycopg2.errorcodes
import psycopg2.extensions

TABLE = "clients_psycopg2"
PARAMETER_STATUS = ("server_version", "server_encoding", "client_encoding", "application_name",
                    "is_superuser", "session_authorization", "DateStyle", "IntervalStyle", "TimeZone",
                    "integer_datetimes", "standard_conforming_strings", "default_transaction_read_only",
                    "in_hot_standby", "scram_iterations")
ODD_TEXT = "o'reilly \\ \"quoted\" ünïcode %s $1 ;--"


class Mismatch(Exception):
    pass


def expect(what, got, want):
    if got != want:
        raise Mismatch("%s: got %r, want %r" % (what, got, want))


def expect_pgcode(what, fn, code):
    try:
        fn()
    except psycopg2.Error as e:
        if e.pgcode != code:
            raise Mismatch("%s: got SQLSTATE %s (%s), want %s" % (what, e.pgcode, e, code))
        return
    raise Mismatch("%s: no error, want SQLSTATE %s" % (what, code))


def one(cur, sql, args=None):
    cur.execute(sql, args)
    return cur.fetchone()


def request(dsn, i, default_tz):
    """One connection-per-request 'request'; raises on any mismatch."""
    conn = psycopg2.connect(dsn)
    try:
        expect("new connection status", conn.status, psycopg2.extensions.STATUS_READY)
        cur = conn.cursor()

        # 1. Parameterized query: psycopg2 quotes the values itself and sends
        # one simple Query. psycopg2 is not in autocommit mode, so this opens
        # a transaction (BEGIN is sent first).
        row = one(cur, "SELECT %s::int + 1, %s::text, %s::numeric, %s IS NULL", (i, ODD_TEXT, "1.50", None))
        expect("parameterized query", row, (i + 1, ODD_TEXT, Decimal("1.50"), True))
        expect("status inside implicit transaction", conn.get_transaction_status(),
               psycopg2.extensions.TRANSACTION_STATUS_INTRANS)
        conn.commit()

        # 2. INSERT + SELECT + ROLLBACK: the row is visible inside the
        # transaction and gone after it.
        cur.execute("INSERT INTO " + TABLE + " (n, note) VALUES (%s, %s)", (i, ODD_TEXT))
        expect("row inside transaction", one(cur, "SELECT count(*), max(note) FROM " + TABLE + " WHERE n = %s", (i,)), (1, ODD_TEXT))
        conn.rollback()
        expect("row after rollback", one(cur, "SELECT count(*) FROM " + TABLE + " WHERE n = %s", (i,)), (0,))
        conn.commit()

        # 3. A server-side error, the failed transaction, rollback, a working query.
        expect_pgcode("division by zero", lambda: cur.execute("SELECT 1 / %s", (0,)), psycopg2.errorcodes.DIVISION_BY_ZERO)
        expect("status after error", conn.get_transaction_status(), psycopg2.extensions.TRANSACTION_STATUS_INERROR)
        expect_pgcode("query in failed transaction", lambda: cur.execute("SELECT 1"),
                      psycopg2.errorcodes.IN_FAILED_SQL_TRANSACTION)
        conn.rollback()
        expect("query after rollback", one(cur, "SELECT %s::int * 2", (i,)), (2 * i,))
        conn.commit()

        # 4. SET TIME ZONE inside a transaction holds for that transaction
        # and is undone by its ROLLBACK.
        cur.execute("SET TIME ZONE 'UTC'")
        expect("TimeZone after SET TIME ZONE 'UTC'", one(cur, "SHOW TimeZone"), ("UTC",))
        expect("timestamptz rendered in UTC",
               one(cur, "SELECT '2024-01-01 00:00:00+00'::timestamptz::text"), ("2024-01-01 00:00:00+00",))
        cur.execute("SET TIME ZONE 'Asia/Kolkata'")
        expect("timestamptz rendered in Asia/Kolkata",
               one(cur, "SELECT '2024-01-01 00:00:00+00'::timestamptz::text"), ("2024-01-01 05:30:00+05:30",))
        conn.rollback()
        expect("TimeZone after rollback", one(cur, "SHOW TimeZone"), (default_tz,))
        conn.commit()
        expect("status at the end", conn.get_transaction_status(), psycopg2.extensions.TRANSACTION_STATUS_IDLE)
    finally:
        conn.close()


def observe_session_state(dsn, default_tz):
    """SET outside a transaction (autocommit), then a second client takes the
    most recently used server connection inside a transaction and the first
    client asks again. Straight to Postgres each client keeps its own
    setting. Prints what happened; it is not an error either way."""
    a = psycopg2.connect(dsn)
    b = psycopg2.connect(dsn)
    try:
        a.autocommit = True
        ca, cb = a.cursor(), b.cursor()
        ca.execute("SET TIME ZONE 'Asia/Kolkata'")
        # b is not in autocommit: its first query opens a transaction and
        # keeps its server connection linked.
        other = one(cb, "SHOW TimeZone")[0]
        own = one(ca, "SHOW TimeZone")[0]
        print("observe: autocommit_set_timezone_seen_by_same_client=%s" % own)
        print("observe: autocommit_set_timezone_seen_by_other_client=%s" % other)
        print("observe: autocommit_set_timezone_client_parameter_status=%s" % a.info.parameter_status("TimeZone"))
        b.rollback()
    finally:
        a.close()
        b.close()
    print("check: (observed, not asserted) session-level SET TIME ZONE with another client in a transaction; server default %s" % default_tz)


def main():
    if len(sys.argv) < 2:
        print("usage: psycopg2_check.py DSN [CONNECTIONS]", file=sys.stderr)
        return 2
    dsn = sys.argv[1]
    total = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    print("check: psycopg2 %s, libpq %s" % (psycopg2.__version__, psycopg2.extensions.libpq_version()))

    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    cur = setup.cursor()
    cur.execute("DROP TABLE IF EXISTS " + TABLE)
    cur.execute("CREATE TABLE " + TABLE + " (n int, note text)")
    default_tz = one(cur, "SHOW TimeZone")[0]
    # The ParameterStatus set a client gets at login (those Postgres reports).
    for name in PARAMETER_STATUS:
        print("observe: startup_parameter_status_%s=%s" % (name, setup.info.parameter_status(name)))
    setup.close()

    # application_name from the DSN is a startup parameter.
    conn = psycopg2.connect(dsn, application_name="psycopg2-check")
    conn.autocommit = True
    print("observe: startup_application_name=%s" % one(conn.cursor(), "SHOW application_name")[0])
    print("observe: startup_application_name_parameter_status=%s" % conn.info.parameter_status("application_name"))
    conn.close()

    errors = 0
    for i in range(1, total + 1):
        try:
            request(dsn, i, default_tz)
        except (Mismatch, psycopg2.Error) as e:
            errors += 1
            print("error: connection %d: %s: %s" % (i, type(e).__name__, str(e).strip()))
    print("check: %d connections: parameterized simple-protocol query, INSERT+SELECT+ROLLBACK, "
          "error+rollback+query, SET TIME ZONE in a transaction (reverted by ROLLBACK to %s)" % (total, default_tz))

    observe_session_state(dsn, default_tz)

    setup = psycopg2.connect(dsn)
    setup.autocommit = True
    setup.cursor().execute("DROP TABLE " + TABLE)
    setup.close()

    print("psycopg2: %d connections, %d errors" % (total, errors))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
