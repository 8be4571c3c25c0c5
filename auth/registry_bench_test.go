package auth

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pgtender/pgtender/config"
)

// benchRegistry is a registry of n verified users, user0…user<n-1> on
// database app, each with password "password".
func benchRegistry(b *testing.B, mode config.PassthroughAuth, n int) (*Registry, []Key) {
	b.Helper()
	r := newRegistry(b, mode)
	verify := func(context.Context, Key, string) error { return nil }
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{User: fmt.Sprintf("user%d", i), Database: "app"}
		if err := r.Authenticate(context.Background(), Login{Key: keys[i], Password: "password"}, verify); err != nil {
			b.Fatal(err)
		}
	}
	return r, keys
}

// BenchmarkRegistryFastPath is one login with the verified password, in a
// registry of 1,000 users with re-verification on (its clock is read).
func BenchmarkRegistryFastPath(b *testing.B) {
	ctx := context.Background()
	r, _ := benchRegistry(b, config.PassthroughEnabled, 1000)
	verify := func(context.Context, Key, string) error { return nil }
	login := Login{Key: Key{User: "user500", Database: "app"}, Password: "password"}
	b.ReportAllocs()
	for b.Loop() {
		if err := r.Authenticate(ctx, login, verify); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRegistryFastPathParallel is the fast path from every P at once,
// each goroutine walking the 10,000 keys from its own offset: ns/op
// falling with -cpu shows there is no shared lock or contended line.
func BenchmarkRegistryFastPathParallel(b *testing.B) {
	ctx := context.Background()
	r, keys := benchRegistry(b, config.PassthroughEnabled, 10_000)
	verify := func(context.Context, Key, string) error { return nil }
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.ResetTimer() // RunParallel, unlike b.Loop, counts the setup otherwise
	b.RunParallel(func(pb *testing.PB) {
		i := int(goroutines.Add(1)) * 7919
		for pb.Next() {
			if err := r.Authenticate(ctx, Login{Key: keys[i%len(keys)], Password: "password"}, verify); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkRegistryWrite10k is one verified password change (a rotation
// under allow_change, with a VerifyFunc that accepts at once) in a
// registry of 10,000 users: the slow path (HMAC, the guards before the
// verification, the singleflight) and the copy of one shard. With
// readers, a goroutine logs in on the fast path all along, and reads/op
// says how many logins it served per write.
func BenchmarkRegistryWrite10k(b *testing.B) {
	for _, readers := range []int{0, 1} {
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			ctx := context.Background()
			r, keys := benchRegistry(b, config.PassthroughEnabledAllowChange, 10_000)
			verify := func(context.Context, Key, string) error { return nil }
			// Readers log in with the keys the writes leave alone.
			readKeys, writeKeys := keys[:len(keys)/2], keys[len(keys)/2:]
			stop := make(chan struct{})
			var reads atomic.Int64
			var wg sync.WaitGroup
			for range readers {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if err := r.Authenticate(ctx, Login{Key: readKeys[i%len(readKeys)], Password: "password"}, verify); err != nil {
							b.Error(err)
							return
						}
						reads.Add(1)
					}
				})
			}
			passwords := [2]string{"password", "rotated"}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				key := writeKeys[n%len(writeKeys)]
				// Every key alternates between the two passwords, so
				// each login is a change.
				password := passwords[(n/len(writeKeys)+1)%2]
				if err := r.Authenticate(ctx, Login{Key: key, Password: password}, verify); err != nil {
					b.Fatal(err)
				}
				n++
			}
			close(stop)
			wg.Wait()
			if readers > 0 {
				b.ReportMetric(float64(reads.Load())/float64(n), "reads/op")
			}
		})
	}
}
