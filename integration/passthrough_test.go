package integration

import (
	"context"
	"crypto/tls"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
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
//
// The throughput ratio is a wall-clock measurement: in make test, where
// other test packages start and stop beside it on a shared machine, it fell
// to 0.55 with nothing wrong in pgtender, so there the test fails only
// below -rotation-min-ratio's default (a collapse, such as a Postgres round
// trip per login); make test-auth-full runs it alone with issue 4's 0.8.
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
	client := warmPassthrough(t, role, passwordA, poolerOptions{general: `passthrough_auth = "enabled_plain_allow_change"`})
	tp := client.pooler
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
	if after < *rotationMinRatio*before {
		t.Errorf("logins/s after the switch %.0f < %.2f × %.0f before", after, *rotationMinRatio, before)
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
			client := warmPassthrough(t, role, password, poolerOptions{
				general: joinLines(`passthrough_auth = "enabled_plain"`, `passthrough_reverify_interval = 500`),
				pool:    `min_pool_size = 1`,
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

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

// wrongPasswordLogins is how many right and how many wrong logins
// TestWrongPasswords makes per mode and pool state. Issue 4 asks for
// 10,000 of each: `make test-auth-full` runs that; `make test` runs the
// default, which keeps the whole suite within a few minutes under -race.
var rotationMinRatio = flag.Float64("rotation-min-ratio", 0.3,
	"TestRotationStorm: least logins/s after the password switch, as a share of before (issue 4: 0.8, make test-auth-full)")

var wrongPasswordLogins = flag.Int("wrong-password-logins", 1000,
	"right and wrong logins each, per mode and pool state, in TestWrongPasswords")

// TestWrongPasswords: in every mode (the two that need client TLS over
// TLS), with
// cold pools (a fresh pgtender: no server connection, nothing verified)
// and warm ones (after one right login: an idle server connection and a
// verified password), logins with random wrong passwords interleaved with
// as many right ones, 32 at a time. No wrong one may be admitted, every
// right one must be, and the Postgres log may show no more failed
// authentications of the role than the failed-verification limits allow:
// one bucket's burst plus one per refill period of the run (configured
// users: none, Postgres is never asked).
//
// A third state, passthrough only: a fresh pgtender whose failure buckets
// were emptied by wrong passwords before the right one was ever verified
// (a restart next to a misconfigured client on the same address). The
// right password, with the most clients waiting on its verification,
// waits for the next token (up to
// auth.DefaultThrottleWait) instead of being refused: at most a few right
// logins may be refused before it takes the waiting place, and from the
// first admitted one on every right login must be admitted. The test
// prints how many were refused. A cold passthrough pgtender can come to
// the same state within the run, when the first wrong passwords take the
// burst before the right one's first verification: the same few refusals
// before the first admitted right login are allowed there, counted alike.
func TestWrongPasswords(t *testing.T) {
	const concurrency = 32
	for _, mode := range []struct {
		name, general string
		configured    bool
		tls           bool // the mode needs client TLS: pgtender gets a certificate, clients use TLS
	}{
		{"disabled_scram", `auth_type = "scram"`, true, false},
		{"disabled_md5", `auth_type = "md5"`, true, false},
		{"enabled_plain", `passthrough_auth = "enabled_plain"`, false, false},
		{"enabled_plain_allow_change", `passthrough_auth = "enabled_plain_allow_change"`, false, false},
		{"enabled", `passthrough_auth = "enabled"`, false, true},
		{"enabled_allow_change", `passthrough_auth = "enabled_allow_change"`, false, true},
	} {
		for _, state := range []string{"cold", "warm", "drained"} {
			if state == "drained" && mode.configured {
				continue // no limiter: Postgres is never asked
			}
			t.Run(mode.name+"/"+state, func(t *testing.T) {
				role := "wrong_" + mode.name + "_" + state
				const password = "the-right-password"
				newRole(t, role, password)
				// 32 clients, and the sessions they just left still
				// finishing: more than the default 16 logins in progress
				// per CPU on a 2-CPU machine, and this test is not about
				// admission control.
				opts := poolerOptions{general: joinLines(mode.general, `max_logins_in_progress = 128`)}
				if mode.tls {
					_, tlsLines := poolerCert(t, t.TempDir())
					opts.general = joinLines(tlsLines, opts.general)
				}
				if mode.configured {
					opts.users = joinLines(`[[users]]`, `name = "`+role+`"`, `database = "`+appDB+`"`, `password = "`+password+`"`)
				}
				tp := startPooler(t, opts)
				client := newLoginClient(t, tp, role)
				if mode.tls {
					client.base.TLSConfig = &tls.Config{RootCAs: sharedCA(t).Pool(), ServerName: "localhost"}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				limit := auth.DefaultFailureLimit
				failedBefore := failedAuthentications(t, role)
				firstFailure := time.Now() // no earlier failure counts
				switch state {
				case "warm":
					if err := client.login(ctx, password); err != nil {
						t.Fatalf("warming login: %v", err)
					}
					if idle := idleServers(tp, role); idle == 0 {
						t.Fatalf("no idle server connection after the warming login")
					}
				case "drained":
					for range 2 * limit.Burst {
						if err := client.login(ctx, randomPassword()); sqlState(err) != "28P01" {
							t.Fatalf("draining login: %v, want SQLSTATE 28P01", err)
						}
					}
				}

				n := *wrongPasswordLogins
				var next atomic.Int64
				var log attemptLog
				start := time.Now()
				var wg sync.WaitGroup
				for range concurrency {
					wg.Go(func() {
						for ctx.Err() == nil {
							j := next.Add(1) - 1
							if j >= int64(2*n) {
								return
							}
							name, pw := "right", password
							if j%2 == 1 {
								name, pw = "wrong", randomPassword()
							}
							now := time.Since(start)
							err := client.login(ctx, pw)
							log.add(attempt{start: now, end: time.Since(start), password: name, err: err})
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)

				attempts := log.sorted()
				firstRight := time.Duration(-1) // end of the first admitted right login
				for _, a := range attempts {
					if a.password == "right" && a.err == nil && (firstRight < 0 || a.end < firstRight) {
						firstRight = a.end
					}
				}
				// Until the right password is first verified, wrong ones may
				// empty its bucket: drained before the run, or within it.
				throttlingPossible := state == "drained" || (state == "cold" && !mode.configured)
				var rightOK, rightFailed, rightThrottled, wrongOK, wrongRefused int
				for _, a := range attempts {
					switch {
					case a.password == "right" && a.err == nil:
						rightOK++
					case a.password == "right" && throttlingPossible && sqlState(a.err) == "28P01" && a.start < firstRight:
						rightThrottled++ // the documented price, counted
					case a.password == "right":
						rightFailed++
						if rightFailed <= 5 {
							t.Errorf("right password refused (at %v): %v", a.start.Round(time.Millisecond), a.err)
						}
					case a.err == nil:
						wrongOK++
					case sqlState(a.err) == "28P01":
						wrongRefused++
					default:
						t.Errorf("wrong password: %v, want SQLSTATE 28P01", a.err)
					}
				}
				failed := failedAuthentications(t, role) - failedBefore
				bound := 0
				if !mode.configured {
					bound = limit.Burst + int(time.Since(firstFailure)/limit.Every) + 1
				}
				stats := tp.PassthroughVerifications()
				t.Logf("%d right, %d wrong in %v (%.0f logins/s): right admitted %d, refused %d; wrong admitted %d, refused 28P01 %d; "+
					"Postgres logged %d failed authentications (bound %d); registry: %d verified, %d rejected, %d throttled, %d from the negative cache",
					n, n, elapsed.Round(time.Millisecond), float64(2*n)/elapsed.Seconds(), rightOK, rightFailed+rightThrottled, wrongOK, wrongRefused,
					failed, bound, stats.OK, stats.Rejected, stats.Throttled, stats.CachedRejection)
				if state == "cold" && rightThrottled > 0 {
					t.Logf("the bucket emptied within the run: %d right logins refused (throttled) before the first right one was admitted, %v into the run",
						rightThrottled, firstRight.Round(time.Millisecond))
					if rightThrottled > 5 {
						t.Errorf("%d right logins refused before the first admitted, want at most 5", rightThrottled)
					}
				}
				if state == "drained" {
					t.Logf("buckets emptied first: %d right logins refused (throttled) before the first right one was admitted, %v into the run",
						rightThrottled, firstRight.Round(time.Millisecond))
					if firstRight < 0 || firstRight > auth.DefaultThrottleWait+limit.Every {
						t.Errorf("first right login admitted %v into the run, want within the throttle wait (%v) and a refill period (%v)",
							firstRight, auth.DefaultThrottleWait, limit.Every)
					}
					// Until more clients wait on the right password than on a
					// guess, its logins are refused: a few at most.
					if rightThrottled > 5 {
						t.Errorf("%d right logins refused before the first admitted, want at most 5", rightThrottled)
					}
				}
				if wrongOK != 0 {
					t.Errorf("%d wrong passwords admitted", wrongOK)
				}
				if failed > bound {
					t.Errorf("Postgres logged %d failed authentications of %s, want at most %d", failed, role, bound)
				}
			})
		}
	}
}

// idleServers is the number of idle server connections of role's pool.
func idleServers(tp *testPooler, role string) int {
	for _, s := range tp.PoolStats() {
		if s.User == role && s.Database == appDB {
			return s.ServersIdle
		}
	}
	return 0
}

// TestRefillWithRejectedPassword: a passthrough pool keeps min_pool_size
// with the verified password. Once Postgres rejects that password (ALTER
// ROLE) the pool's own refills fail with 28P01 once, the entry is marked
// stale, and from then on the refill stops: over six seconds of
// maintenance with server_lifetime closing connections, Postgres sees one
// failed authentication, not one per maintenance pass. The next client
// login with the new password verifies it and the pool fills again.
func TestRefillWithRejectedPassword(t *testing.T) {
	const (
		role     = "refill_rejected"
		password = "refill-password"
		newPW    = "refill-password-2"
	)
	client := warmPassthrough(t, role, password, poolerOptions{
		general: joinLines(`passthrough_auth = "enabled_plain"`, `server_lifetime = 2000`),
		pool:    `min_pool_size = 2`,
	})
	tp := client.pooler
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	total := func() int {
		for _, s := range tp.PoolStats() {
			if s.User == role {
				return s.ServersTotal
			}
		}
		return 0
	}
	eventually(t, 10*time.Second, "the pool to reach min_pool_size", func() bool { return total() >= 2 })

	failedBefore := failedAuthentications(t, role)
	setPassword(t, role, newPW)
	const watch = 6 * time.Second
	time.Sleep(watch) // maintenance passes every second; lifetimes of 2 s expire meanwhile
	failed := failedAuthentications(t, role) - failedBefore
	stats := tp.PassthroughVerifications()
	t.Logf("%v after ALTER ROLE: Postgres logged %d failed authentications of %s; pool has %d server connections; registry: %d rejected, %d from the negative cache",
		watch, failed, role, total(), stats.Rejected, stats.CachedRejection)
	if failed < 1 || failed > 2 {
		t.Errorf("Postgres logged %d failed authentications, want 1 (2 if a refill raced the first refusal)", failed)
	}
	// The stale password is refused without asking Postgres (negative cache).
	if err := client.login(ctx, password); sqlState(err) != "28P01" {
		t.Fatalf("old password after the refill was refused: %v, want 28P01", err)
	}
	if got := failedAuthentications(t, role) - failedBefore; got != failed {
		t.Errorf("the old password went to Postgres again: %d failed authentications, was %d", got, failed)
	}
	if err := client.login(ctx, newPW); err != nil {
		t.Fatalf("new password: %v", err)
	}
	eventually(t, 10*time.Second, "the pool to reach min_pool_size with the new password", func() bool { return total() >= 2 })
}

// reloadUsers rewrites the pooler's users.toml and reloads both files, as
// SIGHUP does (cmd/pgtender: config.Load, then Pooler.Reload).
func reloadUsers(t testing.TB, tp *testPooler, users string) {
	t.Helper()
	if err := os.WriteFile(tp.usersPath, []byte(users), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(tp.configPath, tp.usersPath)
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	if err := tp.Reload(cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
}

// hasPool reports whether the pooler has a pool for role.
func hasPool(tp *testPooler, role string) bool {
	for _, s := range tp.PoolStats() {
		if s.User == role {
			return true
		}
	}
	return false
}

// loggedInPair creates roles a and b with password, starts a pooler with
// opts, and logs each in once; it returns a client of each.
func loggedInPair(t testing.TB, ctx context.Context, a, b, password string, opts poolerOptions) (*loginClient, *loginClient) {
	t.Helper()
	newRole(t, a, password)
	newRole(t, b, password)
	tp := startPooler(t, opts)
	clientA, clientB := newLoginClient(t, tp, a), newLoginClient(t, tp, b)
	for _, c := range []*loginClient{clientA, clientB} {
		if err := c.login(ctx, password); err != nil {
			t.Fatalf("login before the reload: %v", err)
		}
	}
	return clientA, clientB
}

// TestReloadUsers: a reload keeps the passwords passthrough learned for
// users without a users.toml entry (their next login asks Postgres
// nothing), and removes a user whose users.toml entry is gone: under
// passthrough its pool is closed and its next login is verified again;
// with configured users (disabled) it can no longer log in.
func TestReloadUsers(t *testing.T) {
	userEntry := func(name, extra string) string {
		return joinLines(`[[users]]`, `name = "`+name+`"`, `database = "`+appDB+`"`, extra, ``)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("passthrough", func(t *testing.T) {
		const learned, listed, password = "reload_learned", "reload_listed", "reload-password"
		learnedClient, listedClient := loggedInPair(t, ctx, learned, listed, password, poolerOptions{
			general: `passthrough_auth = "enabled_plain"`,
			users:   userEntry(listed, `pool_size = 3`),
		})
		tp := learnedClient.pooler
		before := tp.PassthroughVerifications()
		if before.OK != 2 {
			t.Fatalf("%d verifications before the reload, want 2", before.OK)
		}

		reloadUsers(t, tp, "") // the listed user's entry is removed
		if hasPool(tp, listed) {
			t.Errorf("the removed user's pool is still there after the reload")
		}
		if !hasPool(tp, learned) {
			t.Errorf("the learned user's pool was closed by the reload")
		}
		if err := learnedClient.login(ctx, password); err != nil {
			t.Fatalf("learned user after the reload: %v", err)
		}
		if got := tp.PassthroughVerifications().OK; got != before.OK {
			t.Errorf("the learned user was verified again after the reload (%d verifications, want %d)", got, before.OK)
		}
		if err := listedClient.login(ctx, password); err != nil {
			t.Fatalf("removed user (passthrough: Postgres decides) after the reload: %v", err)
		}
		if got := tp.PassthroughVerifications().OK; got != before.OK+1 {
			t.Errorf("the removed user's password was not verified again (%d verifications, want %d)", got, before.OK+1)
		}
	})

	t.Run("disabled", func(t *testing.T) {
		const kept, dropped, password = "reload_kept", "reload_dropped", "reload-password"
		keptClient, droppedClient := loggedInPair(t, ctx, kept, dropped, password, poolerOptions{
			general: `auth_type = "scram"`,
			users:   userEntry(kept, `password = "`+password+`"`) + userEntry(dropped, `password = "`+password+`"`),
		})
		tp := keptClient.pooler
		reloadUsers(t, tp, userEntry(kept, `password = "`+password+`"`))
		if hasPool(tp, dropped) {
			t.Errorf("the removed user's pool is still there after the reload")
		}
		if err := keptClient.login(ctx, password); err != nil {
			t.Fatalf("kept user after the reload: %v", err)
		}
		if err := droppedClient.login(ctx, password); sqlState(err) != "28P01" {
			t.Fatalf("removed user after the reload: %v, want SQLSTATE 28P01", err)
		}
	})
}

// TestReloadUsersSIGHUP is TestReloadUsers's passthrough case on the
// pgtender binary with a real SIGHUP, counting verifications on /metrics.
func TestReloadUsersSIGHUP(t *testing.T) {
	const learned, listed, password = "sighup_learned", "sighup_listed", "sighup-password"
	newRole(t, learned, password)
	newRole(t, listed, password)
	pr, url := startMetricsProcess(t, processOptions{
		users: joinLines(`[[users]]`, `name = "`+listed+`"`, `database = "`+appDB+`"`, `pool_size = 3`),
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	login := func(user string) error { return pr.login(ctx, user, password) }
	verified := func() float64 {
		return mustSample(t, scrape(t, url), namespace+"passthrough_verifications_total", map[string]string{"result": "ok"})
	}
	eventually(t, 10*time.Second, "pgtender to accept logins", func() bool { return login(learned) == nil })
	if err := login(listed); err != nil {
		t.Fatal(err)
	}
	if got := verified(); got != 2 {
		t.Fatalf("%v verifications before the reload, want 2", got)
	}

	writeFile(t, filepath.Join(filepath.Dir(pr.configPath), "users.toml"), "")
	pr.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 5*time.Second, "reload", func() bool {
		return strings.Contains(pr.output.String(), "configuration reloaded")
	})
	if err := login(learned); err != nil {
		t.Fatalf("learned user after SIGHUP: %v", err)
	}
	if got := verified(); got != 2 {
		t.Errorf("the learned user was verified again after SIGHUP (%v verifications, want 2)", got)
	}
	if err := login(listed); err != nil {
		t.Fatalf("removed user after SIGHUP: %v", err)
	}
	if got := verified(); got != 3 {
		t.Errorf("the removed user's password was not verified again after SIGHUP (%v verifications, want 3)", got)
	}
}
