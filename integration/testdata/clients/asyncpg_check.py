#!/usr/bin/env python3
"""asyncpg connections through a DSN. asyncpg prepares every query as a
named statement (__asyncpg_stmt_N__, numbered per connection, so two
clients' names collide on one server connection) and caches up to
statement_cache_size (default 100) of them per connection.

Usage: asyncpg_check.py DSN CACHE CONNECTIONS TRANSACTIONS

CACHE is "default" (statement_cache_size 100) or a number (0: queries use
the unnamed statement; explicit conn.prepare() still names one, and is not
used in that mode).

CONNECTIONS connections run concurrently, each TRANSACTIONS transactions:
fetchval and fetch of parameterized queries, then in a transaction an
executemany INSERT, a count of its own rows, and (default cache only) a
statement prepared with conn.prepare() and run again; every fourth
transaction raises inside `async with conn.transaction()` and must leave
nothing behind.

The DSN is split into host, port, user, password and database: asyncpg
would send query parameters it does not know (connect_timeout) to the
server as settings.

Every line starts with "check:", "observe:", "error:" or is the final summary
"asyncpg statement_cache_size=C: T transactions, E errors". Exits 1 if E > 0.
"""

import asyncio
import collections
import sys
from urllib.parse import unquote, urlparse

import asyncpg

TABLE = "drivers_asyncpg"


class Mismatch(Exception):
    pass


class Boom(Exception):
    pass


def expect(what, got, want):
    if got != want:
        raise Mismatch("%s: got %r, want %r" % (what, got, want))


async def client(params, cache, cid, transactions, failures, first_errors):
    kwargs = dict(params)
    if cache != "default":
        kwargs["statement_cache_size"] = int(cache)
    try:
        conn = await asyncpg.connect(timeout=10, **kwargs)
    except Exception as e:  # noqa: BLE001 - any connect failure is counted
        failures[(type(e).__name__, getattr(e, "sqlstate", None) or "-")] += transactions
        first_errors.append("connection %d: connect: %s" % (cid, e))
        return
    committed = 0
    try:
        for i in range(transactions):
            try:
                expect("fetchval", await conn.fetchval("SELECT $1::int + $2::int", cid, i), cid + i)
                rows = await conn.fetch("SELECT g, $1::text || g FROM generate_series(1, $2::int) g", "c%d-" % cid, 3)
                expect("fetch", [tuple(r) for r in rows], [(g, "c%d-%d" % (cid, g)) for g in (1, 2, 3)])
                boom = i % 4 == 3
                try:
                    async with conn.transaction():
                        await conn.executemany("INSERT INTO " + TABLE + " (client, n) VALUES ($1, $2)",
                                               [(cid, i * 10 + k) for k in range(3)])
                        expect("own rows", await conn.fetchval("SELECT count(*) FROM " + TABLE + " WHERE client = $1", cid),
                               committed + 3)
                        if cache == "default":
                            stmt = await conn.prepare("SELECT $1::int * 2")
                            expect("prepared", (await stmt.fetchval(i), await stmt.fetchval(i + 1)), (2 * i, 2 * i + 2))
                        if boom:
                            raise Boom()
                except Boom:
                    pass
                if not boom:
                    committed += 3
                expect("own rows after transaction",
                       await conn.fetchval("SELECT count(*) FROM " + TABLE + " WHERE client = $1", cid), committed)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, Mismatch) as e:
                code = getattr(e, "sqlstate", None) or "-"
                failures[(type(e).__name__, code)] += 1
                if len(first_errors) < 10:
                    first_errors.append("connection %d transaction %d: %s %s: %s" % (cid, i, type(e).__name__, code, str(e).strip()))
    finally:
        await conn.close(timeout=10)


async def run(params, cache, connections, transactions):
    print("check: asyncpg %s" % asyncpg.__version__)
    setup = await asyncpg.connect(timeout=10, **params)
    await setup.execute("DROP TABLE IF EXISTS " + TABLE)
    await setup.execute("CREATE TABLE " + TABLE + " (client int, n int)")
    await setup.close()

    failures = collections.Counter()
    first_errors = []
    await asyncio.gather(*(client(params, cache, cid, transactions, failures, first_errors) for cid in range(connections)))
    for line in first_errors:
        print("error: " + line)
    failed = sum(failures.values())
    total = connections * transactions
    if failed:
        kinds = ", ".join("%d %s %s" % (n, name, code) for (name, code), n in sorted(failures.items()))
        print("error: %d of %d transactions failed (%s)" % (failed, total, kinds))

    setup = await asyncpg.connect(timeout=10, **params)
    rows = await setup.fetchval("SELECT count(*) FROM " + TABLE)
    await setup.execute("DROP TABLE " + TABLE)
    await setup.close()
    print("observe: committed_rows=%d" % rows)
    label = "100" if cache == "default" else cache
    print("check: %d connections x %d transactions (fetchval, fetch, executemany in a transaction, every fourth raising), statement_cache_size=%s"
          % (connections, transactions, label))
    print("asyncpg statement_cache_size=%s: %d transactions, %d errors" % (label, total, failed))
    return 1 if failed else 0


def main():
    if len(sys.argv) != 5:
        print("usage: asyncpg_check.py DSN CACHE CONNECTIONS TRANSACTIONS", file=sys.stderr)
        return 2
    u = urlparse(sys.argv[1])
    params = dict(host=u.hostname, port=u.port or 5432, user=unquote(u.username or ""),
                  password=unquote(u.password or ""), database=u.path.lstrip("/"), ssl=False)
    return asyncio.run(run(params, sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))


if __name__ == "__main__":
    sys.exit(main())
