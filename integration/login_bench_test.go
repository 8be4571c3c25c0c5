package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/metrics"
	"github.com/pgtender/pgtender/pooler"
)

// BenchmarkLogin measures a complete passthrough login through pgtender
// (TCP connect, StartupMessage, cleartext password against the verified
// registry entry, parameters, ReadyForQuery, Terminate) with the login
// recorder off (the pooler's no-op) and on (the Prometheus recorder), so
// the difference is what the metrics cost per login.
//
//	go test -run '^$' -bench BenchmarkLogin -benchtime 2000x ./integration/
func BenchmarkLogin(b *testing.B) {
	for _, bench := range []struct {
		name     string
		recorder pooler.LoginRecorder
	}{
		{"recorder=off", nil},
		{"recorder=prometheus", metrics.NewLoginRecorder("pgtender_")},
	} {
		b.Run(bench.name, func(b *testing.B) {
			tp := startPooler(b, poolerOptions{recorder: bench.recorder, general: `passthrough_auth = "enabled_plain"`})
			connString := tp.connString(appUser, appPassword, appDB)
			ctx := context.Background()
			// The first login verifies the password against Postgres; the
			// benchmark measures the logins after it.
			first, err := pgconn.Connect(ctx, connString)
			if err != nil {
				b.Fatal(err)
			}
			first.Close(ctx)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				conn, err := pgconn.Connect(ctx, connString)
				if err != nil {
					b.Fatal(err)
				}
				conn.Close(ctx)
			}
		})
	}
}
