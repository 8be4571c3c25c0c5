package pooler

import (
	"sync"
	"testing"
	"time"
	"unsafe"
)

// TestCounterStripesSum writes a pool's counters from sessions spread over
// its stripes and checks that the sums are what was written, histogram
// included, and that no two stripes share a cache line.
func TestCounterStripesSum(t *testing.T) {
	var st poolStats
	st.stripes = newCounterStripes()
	n := len(st.stripes)
	if n&(n-1) != 0 || n < 2 || n > maxCounterStripes {
		t.Fatalf("%d stripes: want a power of two in [2, %d]", n, maxCounterStripes)
	}
	if size := unsafe.Sizeof(poolCounters{}); size < 2*64 || unsafe.Offsetof(poolCounters{}.checkoutWait)+unsafe.Sizeof(durationHistogram{})+64 > size {
		t.Fatalf("poolCounters is %d bytes with no full cache line after its last counter", size)
	}
	const sessions, each = 40, 1000
	var wg sync.WaitGroup
	used := make(map[*poolCounters]bool)
	for id := range uint32(sessions) {
		used[st.stripe(id*7919)] = true
		wg.Go(func() {
			c := st.stripe(id * 7919)
			for range each {
				c.transactions.Add(1)
				c.queries.Add(2)
				c.bytesReceived.Add(10)
				c.bytesSent.Add(20)
				c.assignments.Add(1)
				c.waitNanos.Add(int64(time.Millisecond))
				c.checkoutWait.observe(3 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if len(used) < 2 {
		t.Errorf("%d sessions wrote %d stripe(s)", sessions, len(used))
	}
	sums := st.sumStripes()
	const total = sessions * each
	got := [...]uint64{sums.transactions, sums.queries, sums.bytesReceived, sums.bytesSent, sums.assignments, uint64(sums.waitTime)}
	want := [...]uint64{total, 2 * total, 10 * total, 20 * total, total, uint64(total * time.Millisecond)}
	if got != want {
		t.Errorf("transactions, queries, bytes received and sent, assignments, wait: %v, want %v", got, want)
	}
	wait := sums.checkoutWait
	if wait.Count != total || wait.Cumulative[2] != 0 || wait.Cumulative[3] != total {
		t.Errorf("checkout wait: count %d, cumulative %v; want %d, all in the 5 ms bucket", wait.Count, wait.Cumulative, total)
	}
	if want := float64(total) * 0.003; wait.SumSeconds < want*0.999 || wait.SumSeconds > want*1.001 {
		t.Errorf("checkout wait sum %.3f s, want %.3f s", wait.SumSeconds, want)
	}
}

// BenchmarkPoolCounters measures what a transaction's counting costs when
// sessions on every core count at once: "striped" as the relay counts (each
// session in the stripe of its process id), "one" with every session on the
// same counters, as before the stripes. On one core the two are alike; the
// difference is the cache lines that cores pass to each other.
func BenchmarkPoolCounters(b *testing.B) {
	count := func(c *poolCounters) {
		c.assignments.Add(1)
		c.checkoutWait.observe(0)
		c.bytesReceived.Add(40)
		c.bytesSent.Add(120)
		c.transactions.Add(1)
		c.queries.Add(1)
	}
	for _, mode := range []string{"striped", "one"} {
		b.Run(mode, func(b *testing.B) {
			var st poolStats
			st.stripes = newCounterStripes()
			var next sync.Mutex
			id := uint32(0)
			b.RunParallel(func(pb *testing.PB) {
				next.Lock()
				id++
				mine := id
				next.Unlock()
				c := st.stripe(0)
				if mode == "striped" {
					c = st.stripe(mine)
				}
				for pb.Next() {
					count(c)
				}
			})
		})
	}
}

// BenchmarkPoolFor measures a login's lookup of its pool once the pool
// exists, from every core at once: a read of the published view, with no
// lock taken.
func BenchmarkPoolFor(b *testing.B) {
	h := newHarnessQuiet(b, nil)
	if _, ok := h.p.poolFor(testUser, testDatabase); !ok {
		b.Fatal("no pool for the test user")
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := h.p.poolFor(testUser, testDatabase); !ok {
				b.Error("no pool for the test user")
				return
			}
		}
	})
}
