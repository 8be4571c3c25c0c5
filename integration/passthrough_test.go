package integration

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRotationStorm is issue 4's rotation storm: 64 clients log in
// continuously with password A under enabled_plain_allow_change; the
// role's password changes to B in Postgres; the clients switch to B over
// two seconds, each login picking A or B at random meanwhile (B with a
// probability rising from 0 to 1). No B login may fail; once the first B
// login has started, A logins may only fail with 28P01, and after the
// first B login succeeded every A login must; nothing else may fail; and
// logins per second after the switch must be at least 0.8 of before (two
// equal windows of the same run, counted by end time).
func TestRotationStorm(t *testing.T) {
	const (
		role       = "rotation_storm"
		passwordA  = "rotation-password-A"
		passwordB  = "rotation-password-B"
		clients    = 64
		warmUp     = 500 * time.Millisecond
		window     = 2 * time.Second // the before and after windows
		switchOver = 2 * time.Second
	)
	newRole(t, role, passwordA)
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain_allow_change"`})
	client := newLoginClient(t, tp, role)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := client.login(ctx, passwordA); err != nil {
		t.Fatalf("first login with A: %v", err)
	}
	failedBefore := failedAuthentications(t, role)
	statsBefore := tp.PassthroughVerifications()

	start := time.Now()
	var altered atomic.Int64 // since start, once ALTER ROLE returned; 0 before
	stop := warmUp + window + switchOver + window
	var log attemptLog
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				now := time.Since(start)
				if now >= stop || ctx.Err() != nil {
					return
				}
				name, password := "A", passwordA
				if at := time.Duration(altered.Load()); at > 0 {
					if p := float64(now-at) / float64(switchOver); rand.Float64() < p {
						name, password = "B", passwordB
					}
				}
				err := client.login(ctx, password)
				log.add(attempt{start: now, end: time.Since(start), password: name, err: err})
			}
		})
	}
	time.Sleep(warmUp + window)
	setPassword(t, role, passwordB)
	alteredAt := time.Since(start)
	altered.Store(int64(alteredAt))
	wg.Wait()

	attempts := log.sorted()
	firstBStart, firstBEnd := time.Duration(-1), time.Duration(-1)
	for _, a := range attempts {
		if a.password == "B" && a.err == nil && (firstBEnd < 0 || a.end < firstBEnd) {
			firstBEnd = a.end
		}
		if a.password == "B" && firstBStart < 0 {
			firstBStart = a.start
		}
	}
	if firstBEnd < 0 {
		t.Fatalf("no B login succeeded; errors: %s", errorSummary(attempts))
	}
	var okA, okB, refusedA, refusedAAfterB, failedB, otherErrors int
	var beforeOK, afterOK int
	afterFrom := alteredAt + switchOver
	for _, a := range attempts {
		switch {
		case a.password == "B" && a.err != nil:
			failedB++
			if failedB <= 5 {
				t.Errorf("B login failed (started %v after ALTER ROLE): %v", a.start-alteredAt, a.err)
			}
		case a.password == "B":
			okB++
		case a.err == nil:
			okA++
			if a.start > firstBEnd {
				t.Errorf("A admitted (started %v after the first B login succeeded)", a.start-firstBEnd)
			}
		case sqlState(a.err) == "28P01" && a.end >= firstBStart:
			refusedA++
			if a.start > firstBEnd {
				refusedAAfterB++
			}
		default:
			otherErrors++
			if otherErrors <= 5 {
				t.Errorf("A login (started %v after ALTER ROLE) failed otherwise: %v", a.start-alteredAt, a.err)
			}
		}
		if a.err == nil && a.end >= warmUp && a.end < warmUp+window {
			beforeOK++
		}
		if a.err == nil && a.end >= afterFrom && a.end < afterFrom+window {
			afterOK++
		}
	}
	before, after := float64(beforeOK)/window.Seconds(), float64(afterOK)/window.Seconds()
	stats := tp.PassthroughVerifications()
	t.Logf("rotation storm, %d clients: %d logins; A admitted %d, A refused 28P01 %d (%d started after the first B login succeeded), B admitted %d, B failed %d, other errors %d",
		clients, len(attempts), okA, refusedA, refusedAAfterB, okB, failedB, otherErrors)
	t.Logf("ALTER ROLE at %v; first B login started %v, succeeded %v later; logins/s before %.0f, after %.0f (ratio %.2f)",
		alteredAt.Round(time.Millisecond), (firstBStart - alteredAt).Round(time.Millisecond),
		(firstBEnd - firstBStart).Round(time.Millisecond), before, after, after/before)
	t.Logf("Postgres: %d failed authentications of %s; registry: %d verified, %d rejected, %d errors, %d throttled, %d refused from the negative cache",
		failedAuthentications(t, role)-failedBefore, role, stats.OK-statsBefore.OK, stats.Rejected-statsBefore.Rejected,
		stats.Error-statsBefore.Error, stats.Throttled-statsBefore.Throttled, stats.CachedRejection-statsBefore.CachedRejection)
	if refusedAAfterB == 0 {
		t.Errorf("no A login started after the first B login succeeded: the storm did not test the refusal")
	}
	if after < 0.8*before {
		t.Errorf("logins/s after the switch %.0f < 0.8 × %.0f before", after, before)
	}
}

// TestRevocation: with warm pools and clients logging in with password A,
// the role's password is changed (or the role loses LOGIN, or expires) in
// Postgres and no client ever presents another password. With
// passthrough_reverify_interval = 500 ms, A logins must be refused with
// 28P01 within that interval plus one check (plus the registry's clock
// tick, an eighth of the interval here), and every login before the first
// refusal must have succeeded, every one after it failed.
func TestRevocation(t *testing.T) {
	const (
		interval = 500 * time.Millisecond
		tick     = interval / 4 // the registry's coarse clock (auth.startCoarseClock)
		// checkAllowance is what "one check" may take: a server login on a
		// loaded 2-core machine, with -race.
		checkAllowance = time.Second
		clients        = 8
		password       = "revocation-password"
	)
	for _, c := range []struct{ name, change string }{
		{"password", "PASSWORD 'changed-by-the-operator'"},
		{"nologin", "NOLOGIN"},
		{"valid_until", "VALID UNTIL '2000-01-01'"},
	} {
		t.Run(c.name, func(t *testing.T) {
			role := "revoke_" + c.name
			newRole(t, role, password)
			tp := startPooler(t, poolerOptions{
				general: joinLines(`passthrough_auth = "enabled_plain"`, `passthrough_reverify_interval = 500`),
				pool:    `min_pool_size = 1`,
			})
			client := newLoginClient(t, tp, role)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := client.login(ctx, password); err != nil {
				t.Fatalf("first login: %v", err)
			}

			start := time.Now()
			var revoked, refused atomic.Int64 // since start; 0 until then
			var log attemptLog
			var wg sync.WaitGroup
			for range clients {
				wg.Go(func() {
					for ctx.Err() == nil {
						now := time.Since(start)
						// Go on for a second after the first refusal, ten
						// at most after the change.
						if r := refused.Load(); r > 0 && now > time.Duration(r)+time.Second {
							return
						}
						if r := revoked.Load(); r > 0 && now > time.Duration(r)+10*time.Second {
							return
						}
						err := client.login(ctx, password)
						end := time.Since(start)
						if err != nil {
							refused.CompareAndSwap(0, int64(end))
						}
						log.add(attempt{start: now, end: end, password: "A", err: err})
					}
				})
			}
			time.Sleep(time.Second) // several re-verifications pass meanwhile
			alterRole(t, role, c.change)
			revokedAt := time.Since(start)
			revoked.Store(int64(revokedAt))
			wg.Wait()

			attempts := log.sorted()
			var firstRefusal time.Duration = -1
			for _, a := range attempts {
				if a.err != nil && (firstRefusal < 0 || a.end < firstRefusal) {
					firstRefusal = a.end
				}
			}
			if firstRefusal < 0 {
				t.Fatalf("A was never refused within 10 s of the change (%d logins)", len(attempts))
			}
			var okBefore, okAfterChange, refusedN int
			for _, a := range attempts {
				switch {
				case a.err == nil && a.start > firstRefusal:
					t.Errorf("admitted %v after the first refusal", a.start-firstRefusal)
				case a.err == nil && a.end < revokedAt:
					okBefore++
				case a.err == nil:
					okAfterChange++
				case a.end < revokedAt:
					t.Errorf("a login before the change failed: %v", a.err)
				case sqlState(a.err) != "28P01":
					t.Errorf("refused with %v, want SQLSTATE 28P01", a.err)
				default:
					refusedN++
				}
			}
			window := firstRefusal - revokedAt
			t.Logf("%s: %d logins admitted before the change, %d after it until the first refusal %v later (bound %v), %d refused with 28P01",
				c.change, okBefore, okAfterChange, window.Round(time.Millisecond), interval+tick+checkAllowance, refusedN)
			if window > interval+tick+checkAllowance {
				t.Errorf("first refusal %v after the change, want at most the interval %v + a clock tick %v + one check (%v)",
					window, interval, tick, checkAllowance)
			}
		})
	}
}
