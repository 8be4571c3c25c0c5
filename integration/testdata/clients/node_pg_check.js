'use strict';
// node-postgres client for pgtender's integration tests.
//
// Usage: node node_pg_check.js DSN [MAX_BACKENDS]
//
// With MAX_BACKENDS, the pool's 10 clients must have been served by at most
// that many Postgres backends (a pooler's pool size).
//
// pg sends parameterized queries with the extended protocol and an unnamed
// statement (Parse/Bind/Describe/Execute/Sync). This script runs such queries,
// a transaction, errors (one raised while executing, one while binding a
// parameter, one inside a transaction), and a pg.Pool of 10 clients doing
// 500 queries in total. It then looks at a named statement ({name: ...}),
// which pgtender does not carry across server connections yet
// (docs/pooling.md), and prints "observe:" lines the Go test compares with a
// run straight against Postgres.
//
// Every line starts with "check:", "observe:", "info:", "error:" or is the
// final summary "node-postgres: 500 pooled queries, N in all, E errors".
// Exits 1 if E > 0.

const pg = require('pg');
const assert = require('assert');

const dsn = process.argv[2];
const maxBackends = process.argv[3] ? Number(process.argv[3]) : 0;
if (!dsn) {
  console.error('usage: node node_pg_check.js DSN');
  process.exit(2);
}
const TABLE = 'clients_node_pg';
const POOLED = 500;
const ODD = "o'reilly \\ \"quoted\" ünïcode $1 ;--";

let queries = 0;
let errors = 0;

function fail(what, err) {
  errors++;
  console.log(`error: ${what}: ${err && err.stack ? err.stack.split('\n')[0] : err}`);
}

async function q(client, text, values) {
  queries++;
  return client.query(text, values);
}

async function expectCode(what, promise, code) {
  try {
    await promise;
  } catch (err) {
    assert.strictEqual(err.code, code, `${what}: got SQLSTATE ${err.code} (${err.message}), want ${code}`);
    return;
  }
  throw new Error(`${what}: no error, want SQLSTATE ${code}`);
}

async function singleClient() {
  const client = new pg.Client({ connectionString: dsn, application_name: 'node-pg-check' });
  await client.connect();
  try {
    await q(client, `DROP TABLE IF EXISTS ${TABLE}`);
    await q(client, `CREATE TABLE ${TABLE} (n int, note text, data bytea)`);
    const app = await q(client, 'SHOW application_name');
    console.log(`observe: startup_application_name=${app.rows[0].application_name}`);

    // Parameters of several types, NULL, and a 1 MiB value.
    const big = 'x'.repeat(1 << 20);
    const bytes = Buffer.from([0, 1, 2, 255]);
    let r = await q(client, 'SELECT $1::int + 1 AS n, $2::text AS s, $3::numeric AS d, $4::text IS NULL AS isnull, length($5::text) AS len, $6::bytea AS b',
      [41, ODD, '1.50', null, big, bytes]);
    assert.deepStrictEqual(r.rows[0], { n: 42, s: ODD, d: '1.50', isnull: true, len: 1 << 20, b: bytes });
    for (let i = 0; i < 50; i++) {
      r = await q(client, 'SELECT $1::int * 2 AS v', [i]);
      assert.strictEqual(r.rows[0].v, 2 * i);
    }
    console.log('check: extended-protocol queries with int, text, numeric, NULL, 1 MiB text and bytea parameters');

    // A transaction: INSERT + SELECT visible inside, gone after ROLLBACK; a committed one stays.
    await q(client, 'BEGIN');
    await q(client, `INSERT INTO ${TABLE} (n, note) VALUES ($1, $2)`, [1, ODD]);
    r = await q(client, `SELECT count(*)::int AS c FROM ${TABLE} WHERE n = $1`, [1]);
    assert.strictEqual(r.rows[0].c, 1);
    await q(client, 'ROLLBACK');
    r = await q(client, `SELECT count(*)::int AS c FROM ${TABLE}`);
    assert.strictEqual(r.rows[0].c, 0);
    await q(client, 'BEGIN');
    await q(client, `INSERT INTO ${TABLE} (n, note) VALUES ($1, $2)`, [2, ODD]);
    await q(client, 'COMMIT');
    r = await q(client, `SELECT note FROM ${TABLE} WHERE n = $1`, [2]);
    assert.deepStrictEqual(r.rows, [{ note: ODD }]);
    console.log('check: BEGIN/INSERT/SELECT/ROLLBACK leaves nothing; BEGIN/INSERT/COMMIT keeps the row');

    // Errors: at execution, at bind (bad parameter), and inside a transaction.
    await expectCode('division by zero', q(client, 'SELECT 1 / $1::int', [0]), '22012');
    await expectCode('bad int parameter', q(client, 'SELECT $1::int', ['not a number']), '22P02');
    await expectCode('syntax error', q(client, 'SELEC 1'), '42601');
    r = await q(client, 'SELECT $1::text AS ok', ['after errors']);
    assert.strictEqual(r.rows[0].ok, 'after errors');
    await q(client, 'BEGIN');
    await expectCode('missing table in transaction', q(client, 'SELECT * FROM no_such_table_here'), '42P01');
    await expectCode('query in failed transaction', q(client, 'SELECT 1'), '25P02');
    await q(client, 'ROLLBACK');
    r = await q(client, 'SELECT $1::int AS v', [7]);
    assert.strictEqual(r.rows[0].v, 7);
    console.log('check: errors at execute (22012), at bind (22P02), at parse (42601), in a transaction (42P01 then 25P02), each followed by a working query');
  } finally {
    await client.end();
  }
}

async function pooled() {
  const pool = new pg.Pool({ connectionString: dsn, max: 10 });
  const total = POOLED;
  const pids = new Set();
  let done = 0;
  try {
    // Every pool client takes its share of the 500 queries concurrently.
    await Promise.all(Array.from({ length: 10 }, async (_, worker) => {
      const client = await pool.connect();
      try {
        for (let i = worker; i < total; i += 10) {
          const r = await q(client, 'SELECT $1::int AS i, $2::text AS w, pg_backend_pid() AS pid', [i, `worker-${worker}`]);
          assert.strictEqual(r.rows[0].i, i);
          assert.strictEqual(r.rows[0].w, `worker-${worker}`);
          pids.add(r.rows[0].pid);
          done++;
        }
      } finally {
        client.release();
      }
    }));
    assert.strictEqual(done, total);
    console.log(`check: pg.Pool of 10 clients ran ${total} parameterized queries, every answer matched its query`);
    console.log(`info: distinct server backends used by the pool: ${pids.size}`);
    if (maxBackends) {
      assert.ok(pids.size >= 1 && pids.size <= maxBackends, `the pool used ${pids.size} server backends, want 1..${maxBackends}`);
      console.log(`check: the 10 pool clients were served by ${pids.size} server backends (at most ${maxBackends})`);
    }
  } finally {
    await pool.end();
  }
}

// A named statement is prepared on the server connection that ran it; pg
// remembers that it prepared it and later sends only Bind/Execute. A second
// client holding that server connection in a transaction makes the first
// client's next query go to another server connection.
async function observeNamedStatement() {
  const a = new pg.Client({ connectionString: dsn });
  const b = new pg.Client({ connectionString: dsn });
  await a.connect();
  await b.connect();
  try {
    const stmt = { name: 'clients_named', text: 'SELECT $1::int + 1 AS v', values: [1] };
    let r = await q(a, stmt);
    assert.strictEqual(r.rows[0].v, 2);
    await q(b, 'BEGIN');
    await q(b, 'SELECT 1');
    let outcome;
    try {
      r = await q(a, { ...stmt, values: [2] });
      outcome = `ok:${r.rows[0].v}`;
    } catch (err) {
      outcome = `SQLSTATE ${err.code}`;
    }
    console.log(`observe: named_statement_reused_after_other_client_took_its_server=${outcome}`);
    await q(b, 'ROLLBACK');
    r = await q(a, 'SELECT $1::int AS v', [3]);
    assert.strictEqual(r.rows[0].v, 3);
  } finally {
    await a.end();
    await b.end();
  }
}

async function main() {
  console.log(`check: node ${process.version}, pg ${require('pg/package.json').version}`);
  for (const [what, fn] of [['single client', singleClient], ['pool', pooled], ['named statement', observeNamedStatement]]) {
    try {
      await fn();
    } catch (err) {
      fail(what, err);
    }
  }
  try {
    const c = new pg.Client({ connectionString: dsn });
    await c.connect();
    await c.query(`DROP TABLE IF EXISTS ${TABLE}`);
    await c.end();
  } catch (err) {
    fail('cleanup', err);
  }
  console.log(`node-postgres: ${POOLED} pooled queries, ${queries} in all, ${errors} errors`);
  process.exit(errors ? 1 : 0);
}

main();
