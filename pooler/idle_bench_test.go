package pooler

import (
	"net"
	"runtime"
	"testing"
	"time"

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
	settle := func() runtime.MemStats {
		time.Sleep(100 * time.Millisecond) // the sessions reach their idle read
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m
	}
	before := settle()
	conns := make([]net.Conn, 0, b.N)
	b.ResetTimer()
	for range b.N {
		conns = append(conns, client.loginAndQuery(b))
	}
	b.StopTimer()
	after := settle()
	perClient := func(after, before uint64) float64 { return (float64(after) - float64(before)) / float64(len(conns)) }
	b.ReportMetric(perClient(after.HeapAlloc, before.HeapAlloc), "heap-B/client")
	b.ReportMetric(perClient(after.StackInuse, before.StackInuse), "stack-B/client")
	b.ReportMetric(perClient(after.HeapInuse+after.StackInuse, before.HeapInuse+before.StackInuse), "inuse-B/client")
	for _, c := range conns {
		c.Close()
	}
}
