package pooler

import (
	"net"
	"runtime"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/config"
)

// BenchmarkIdleClientMemory holds b.N logged-in clients idle (plain TCP,
// transaction mode, cleartext passthrough login, each after one SELECT 1)
// and reports what the process holds per client once the garbage of their
// logins is collected: the live heap (heap-B/client), the goroutine stacks
// (stack-B/client) and both as spans in use (inuse-B/client). The clients
// are raw sockets in this process, so a client socket's share (a few
// hundred bytes) is in the heap figures too. RSS, which also holds the
// garbage between collections, is make bench's idle row. For where the heap
// goes:
//
//	go test -run '^$' -bench IdleClientMemory -benchtime 3000x -memprofile mem.out -memprofilerate 1 ./pooler
//
// (the profile is written after the clients closed; inuse_space at the
// hold needs a heap profile taken before they close).
func BenchmarkIdleClientMemory(b *testing.B) {
	h := newHarnessQuiet(b, func(cfg *config.Config) {
		cfg.General.PassthroughAuth = config.PassthroughEnabledPlain
	})
	client := newRawClient(b, h.p.Addr().String())
	client.loginAndQuery(b).Close() // the first login verifies the password
	settle := func(clients int) runtime.MemStats {
		// The sessions reach their idle read, and the parker's sweeps
		// park them (park.go): within two sweep intervals.
		time.Sleep(100 * time.Millisecond)
		for deadline := time.Now().Add(10 * time.Second); h.p.ClientParking().Parked < int64(clients) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m
	}
	before := settle(0)
	conns := make([]net.Conn, 0, b.N)
	b.ResetTimer()
	for range b.N {
		conns = append(conns, client.loginAndQuery(b))
	}
	b.StopTimer()
	after := settle(len(conns))
	perClient := func(after, before uint64) float64 { return (float64(after) - float64(before)) / float64(len(conns)) }
	b.ReportMetric(perClient(after.HeapAlloc, before.HeapAlloc), "heap-B/client")
	b.ReportMetric(perClient(after.StackInuse, before.StackInuse), "stack-B/client")
	b.ReportMetric(perClient(after.HeapInuse+after.StackInuse, before.HeapInuse+before.StackInuse), "inuse-B/client")
	b.ReportMetric(float64(h.p.ClientParking().Parked)/float64(len(conns)), "parked/client")
	for _, c := range conns {
		c.Close()
	}
}

// BenchmarkParkedClientQuery is BenchmarkRelaySimpleQuery's round trip
// made by a client that was parked before each one (parked): the cost a
// client pays on its first request after a pause, on top of the relay's
// (its session resumed on a new goroutine, the socket taken off the
// parker's set). The wait for each parking is not timed; stopping and
// starting the timer costs something of its own, so the same round trip
// with the timer stopped and started the same way but no parking
// (not-parked) is what to compare with.
func BenchmarkParkedClientQuery(b *testing.B) {
	for _, run := range []struct {
		name   string
		parked bool
		sweep  time.Duration // an hour: no sweep within the benchmark
	}{{"parked", true, time.Millisecond}, {"not-parked", false, time.Hour}} {
		parked := run.parked
		b.Run(run.name, func(b *testing.B) {
			h := newHarnessSetup(b, nil, nil, zap.NewNop(), func(p *Pooler) { p.parkTuning = parkTuning{sweep: run.sweep} })
			round := simpleQueryRound(b, h)
			round()
			parks := h.p.ClientParking().Parks
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for deadline := time.Now().Add(5 * time.Second); parked && h.p.ClientParking().Parks == parks; {
					if time.Now().After(deadline) {
						b.Fatal("the client was not parked within 5 s")
					}
					time.Sleep(100 * time.Microsecond)
				}
				parks = h.p.ClientParking().Parks
				b.StartTimer()
				round()
			}
		})
	}
}
