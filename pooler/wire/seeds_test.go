package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The shapes of extended-protocol traffic from the drivers the pooler
// serves, built with pgproto3. They seed the unit tests, the fuzz targets
// (f.Add) and the seed corpus files under testdata/fuzz/ (see
// TestSeedCorpus).

// pgxStatementName is the name pgx v5's statement cache gives sql
// (internal/stmtcache.StatementName).
func pgxStatementName(sql string) string {
	digest := sha256.Sum256([]byte(sql))
	return "stmtcache_" + hex.EncodeToString(digest[0:24])
}

// Type OIDs the drivers send.
const (
	oidBool    = 16
	oidBytea   = 17
	oidInt8    = 20
	oidInt4    = 23
	oidText    = 25
	oidVarchar = 1043
	oidUUID    = 2950
)

type namedSeed struct {
	name string
	msg  encoder
}

// bodyOf encodes msg with pgproto3 and returns its body.
func bodyOf(t testing.TB, msg encoder) []byte {
	t.Helper()
	return encode(t, msg)[HeaderLen:]
}

const pgbenchSelect = "SELECT abalance FROM pgbench_accounts WHERE aid = $1"

func parseSeeds() []namedSeed {
	return []namedSeed{
		// pgx: cached statements named by hash, no types (Postgres infers them).
		{"pgx-stmtcache", &pgproto3.Parse{Name: pgxStatementName(pgbenchSelect), Query: pgbenchSelect}},
		// pgx, QueryExecModeDescribeExec and friends: the unnamed statement.
		{"pgx-unnamed", &pgproto3.Parse{Query: "select $1::int8, $2::text"}},
		// psycopg 3 after prepare_threshold executions, with its dumpers' OIDs (0 for str).
		{"psycopg3-pg3_0", &pgproto3.Parse{Name: "_pg3_0", Query: "SELECT * FROM users WHERE id = $1 AND name = $2", ParameterOIDs: []uint32{oidInt8, 0}}},
		{"psycopg3-pg3_12", &pgproto3.Parse{Name: "_pg3_12", Query: "INSERT INTO t (a, b, c) VALUES ($1, $2, $3)", ParameterOIDs: []uint32{oidInt4, oidBytea, oidBool}}},
		// pgjdbc: server-prepared after prepareThreshold, S_n names, declared types.
		{"jdbc-S_1", &pgproto3.Parse{Name: "S_1", Query: "select * from accounts where id = $1 and owner = $2", ParameterOIDs: []uint32{oidInt4, oidVarchar}}},
		{"jdbc-begin", &pgproto3.Parse{Name: "S_2", Query: "BEGIN"}},
		// asyncpg: every statement named, no types.
		{"asyncpg-stmt", &pgproto3.Parse{Name: "__asyncpg_stmt_1__", Query: "SELECT $1::uuid, now()"}},
		{"empty-query", &pgproto3.Parse{}},
	}
}

func bindSeeds() []namedSeed {
	return []namedSeed{
		{"pgx-binary", &pgproto3.Bind{PreparedStatement: pgxStatementName(pgbenchSelect), ParameterFormatCodes: []int16{1}, Parameters: [][]byte{{0, 0, 0, 0, 0, 0, 0, 42}}, ResultFormatCodes: []int16{1}}},
		{"pgx-unnamed", &pgproto3.Bind{Parameters: [][]byte{[]byte("1"), []byte("x")}}},
		{"psycopg3-pg3_0", &pgproto3.Bind{PreparedStatement: "_pg3_0", ParameterFormatCodes: []int16{0, 0}, Parameters: [][]byte{[]byte("7"), nil}, ResultFormatCodes: []int16{0}}},
		// pgjdbc with a fetch size binds a named portal.
		{"jdbc-portal", &pgproto3.Bind{DestinationPortal: "C_3", PreparedStatement: "S_1", ParameterFormatCodes: []int16{1, 0}, Parameters: [][]byte{{0, 0, 0, 9}, []byte("bob")}}},
		{"asyncpg-stmt", &pgproto3.Bind{PreparedStatement: "__asyncpg_stmt_1__", ParameterFormatCodes: []int16{1}, Parameters: [][]byte{make([]byte, 16)}, ResultFormatCodes: []int16{1, 1}}},
		{"large-param", &pgproto3.Bind{PreparedStatement: "_pg3_1", ParameterFormatCodes: []int16{1}, Parameters: [][]byte{make([]byte, 3000)}}},
		{"no-params", &pgproto3.Bind{}},
	}
}

func targetSeeds() []namedSeed {
	return []namedSeed{
		{"pgx-describe-statement", &pgproto3.Describe{ObjectType: TargetStatement, Name: pgxStatementName(pgbenchSelect)}},
		{"pgx-close-statement", &pgproto3.Close{ObjectType: TargetStatement, Name: pgxStatementName(pgbenchSelect)}},
		{"describe-unnamed-portal", &pgproto3.Describe{ObjectType: TargetPortal}},
		{"psycopg3-close-pg3_0", &pgproto3.Close{ObjectType: TargetStatement, Name: "_pg3_0"}},
		{"jdbc-describe-S_1", &pgproto3.Describe{ObjectType: TargetStatement, Name: "S_1"}},
		{"jdbc-close-portal", &pgproto3.Close{ObjectType: TargetPortal, Name: "C_3"}},
		{"asyncpg-describe", &pgproto3.Describe{ObjectType: TargetStatement, Name: "__asyncpg_stmt_1__"}},
	}
}

func dataRowSeeds() []namedSeed {
	return []namedSeed{
		// The probe of a server connection's session settings.
		{"settings", &pgproto3.DataRow{Values: [][]byte{[]byte("search_path"), []byte(`"$user", public`)}}},
		{"timezone", &pgproto3.DataRow{Values: [][]byte{[]byte("TimeZone"), []byte("Europe/Paris")}}},
		{"nulls-and-empty", &pgproto3.DataRow{Values: [][]byte{nil, {}, []byte("x"), nil}}},
		{"binary-int8", &pgproto3.DataRow{Values: [][]byte{{0, 0, 0, 0, 0, 0, 0, 42}}}},
		{"no-columns", &pgproto3.DataRow{}},
	}
}
