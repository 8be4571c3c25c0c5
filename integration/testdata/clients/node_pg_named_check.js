'use strict';
// node-postgres named queries for pgtender's integration tests.
//
// Usage: node node_pg_named_check.js DSN CLIENTS TRANSACTIONS
//
// A query with a name ({name: 'q_sum', text, values}) is prepared as that
// named statement on the client's first use; pg remembers that its
// connection has it and afterwards sends only Bind/Execute. Every client
// uses the same names, so through a pooler they meet each other's
// statements on shared server connections.
//
// CLIENTS clients run concurrently, each TRANSACTIONS transactions:
// a named parameterized SELECT outside a transaction, then BEGIN, a named
// INSERT, a named count of the client's own rows, and COMMIT (ROLLBACK
// every fourth time, which must leave nothing).
//
// Every line starts with "check:", "observe:", "error:" or is the final
// summary "node-postgres named: T transactions, E errors". Exits 1 if E > 0.

const pg = require('pg');

const [dsn, clientsArg, transactionsArg] = process.argv.slice(2);
if (!dsn || !clientsArg || !transactionsArg) {
  console.error('usage: node node_pg_named_check.js DSN CLIENTS TRANSACTIONS');
  process.exit(2);
}
const CLIENTS = Number(clientsArg);
const TRANSACTIONS = Number(transactionsArg);
const TABLE = 'drivers_node_named';

const failures = new Map();
const firstErrors = [];

function expect(what, got, want) {
  if (got !== want) throw new Error(`${what}: got ${got}, want ${want}`);
}

async function client(id) {
  const c = new pg.Client({ connectionString: dsn });
  try {
    await c.connect();
  } catch (err) {
    failures.set(`connect ${err.code || '-'}`, (failures.get(`connect ${err.code || '-'}`) || 0) + TRANSACTIONS);
    firstErrors.push(`client ${id}: connect: ${err.message}`);
    return;
  }
  let committed = 0;
  try {
    for (let i = 0; i < TRANSACTIONS; i++) {
      let inTransaction = false;
      try {
        let r = await c.query({ name: 'q_sum', text: 'SELECT $1::int + $2::int AS v', values: [id, i] });
        expect('q_sum', r.rows[0].v, id + i);
        await c.query('BEGIN');
        inTransaction = true;
        await c.query({ name: 'q_insert', text: `INSERT INTO ${TABLE} (client, n) VALUES ($1, $2)`, values: [id, i] });
        r = await c.query({ name: 'q_count', text: `SELECT count(*)::int AS n FROM ${TABLE} WHERE client = $1`, values: [id] });
        expect('q_count in transaction', r.rows[0].n, committed + 1);
        if (i % 4 === 3) {
          await c.query('ROLLBACK');
        } else {
          await c.query('COMMIT');
          committed++;
        }
        inTransaction = false;
        r = await c.query({ name: 'q_count', text: `SELECT count(*)::int AS n FROM ${TABLE} WHERE client = $1`, values: [id] });
        expect('q_count after transaction', r.rows[0].n, committed);
      } catch (err) {
        const key = `${err.code ? 'SQLSTATE ' + err.code : err.constructor.name}`;
        failures.set(key, (failures.get(key) || 0) + 1);
        if (firstErrors.length < 10) firstErrors.push(`client ${id} transaction ${i}: ${key}: ${err.message}`);
        if (inTransaction) await c.query('ROLLBACK').catch(() => {});
      }
    }
  } finally {
    await c.end();
  }
}

async function main() {
  console.log(`check: node ${process.version}, pg ${require('pg/package.json').version}`);
  const setup = new pg.Client({ connectionString: dsn });
  await setup.connect();
  await setup.query(`DROP TABLE IF EXISTS ${TABLE}`);
  await setup.query(`CREATE TABLE ${TABLE} (client int, n int)`);
  await Promise.all(Array.from({ length: CLIENTS }, (_, id) => client(id)));
  const total = CLIENTS * TRANSACTIONS;
  let failed = 0;
  for (const n of failures.values()) failed += n;
  for (const line of firstErrors) console.log(`error: ${line}`);
  if (failed) {
    const kinds = [...failures.entries()].sort().map(([k, n]) => `${n} ${k}`).join(', ');
    console.log(`error: ${failed} of ${total} transactions failed (${kinds})`);
  }
  const r = await setup.query(`SELECT count(*)::int AS n FROM ${TABLE}`);
  console.log(`observe: committed_rows=${r.rows[0].n}`);
  await setup.query(`DROP TABLE ${TABLE}`);
  await setup.end();
  console.log(`check: ${CLIENTS} clients x ${TRANSACTIONS} transactions of named queries (q_sum, q_insert, q_count; every fourth rolled back)`);
  console.log(`node-postgres named: ${total} transactions, ${failed} errors`);
  process.exit(failed ? 1 : 0);
}

main().catch((err) => {
  console.log(`error: ${err.stack}`);
  console.log('node-postgres named: 0 transactions, 1 errors');
  process.exit(1);
});
