package auth

import "time"

// Defaults of a Registry; each has an Option to change it.
const (
	// DefaultReverifyInterval is how old a verified password may grow
	// before its next use checks it against Postgres again
	// (passthrough_reverify_interval).
	DefaultReverifyInterval = 60 * time.Second
	// DefaultNegativeCacheTTL is how long a password Postgres rejected is
	// refused without asking Postgres again.
	DefaultNegativeCacheTTL = 10 * time.Second
)

// DefaultFailureLimit is the failed-verification limit per user and per
// client address: 5 at once, then one more per second.
var DefaultFailureLimit = Limit{Burst: 5, Every: time.Second}

// DefaultThrottleWait is how long a verification refused by the failure
// limits may wait for the next token, when more clients wait on it than on
// any other verification of the user (see Registry.Authenticate).
const DefaultThrottleWait = time.Second

// Limit is a token bucket of failed verifications: Burst of them at once,
// then one more per Every. A Limit without a positive Burst and a
// positive Every, the zero Limit for one, means no limit.
type Limit struct {
	Burst int
	Every time.Duration
}

// Option changes one default of NewRegistry.
type Option func(*options)

type options struct {
	reverifyInterval time.Duration
	negativeTTL      time.Duration
	userLimit        Limit
	addrLimit        Limit
	throttleWait     time.Duration
	// now is the clock; tests replace it (clockInjected), and then the
	// fast path reads it too instead of the coarse clock.
	now           func() time.Time
	clockInjected bool
}

func defaultOptions() options {
	return options{
		reverifyInterval: DefaultReverifyInterval,
		negativeTTL:      DefaultNegativeCacheTTL,
		userLimit:        DefaultFailureLimit,
		addrLimit:        DefaultFailureLimit,
		throttleWait:     DefaultThrottleWait,
		now:              time.Now,
	}
}

// WithReverifyInterval sets how old a verified password may grow before
// its next use re-verifies it in the background; 0 (or less) turns
// re-verification off. It is meant to take passthrough_reverify_interval
// as it is (0 = never).
func WithReverifyInterval(d time.Duration) Option {
	return func(o *options) { o.reverifyInterval = max(d, 0) }
}

// WithNegativeCacheTTL sets how long a rejected password is refused
// without asking Postgres; 0 (or less) turns the negative cache off.
func WithNegativeCacheTTL(d time.Duration) Option {
	return func(o *options) { o.negativeTTL = max(d, 0) }
}

// WithFailureLimits sets the failed-verification limits per user (role)
// and per client address. A zero Limit turns that limit off.
func WithFailureLimits(perUser, perAddress Limit) Option {
	return func(o *options) { o.userLimit, o.addrLimit = perUser, perAddress }
}

// WithThrottleWait sets how long a throttled verification may wait for
// the next token (DefaultThrottleWait); 0 (or less) refuses it at once.
func WithThrottleWait(d time.Duration) Option {
	return func(o *options) { o.throttleWait = max(d, 0) }
}

// withClock replaces time.Now, for tests.
func withClock(now func() time.Time) Option {
	return func(o *options) { o.now, o.clockInjected = now, true }
}
