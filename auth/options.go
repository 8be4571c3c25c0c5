package auth

import "time"

// Defaults of a Registry; each has an Option to change it.
const (
	// DefaultNegativeCacheTTL is how long a password Postgres rejected is
	// refused without asking Postgres again.
	DefaultNegativeCacheTTL = 10 * time.Second
)

// Option changes one default of NewRegistry.
type Option func(*options)

type options struct {
	negativeTTL time.Duration
	// now is the clock; tests replace it.
	now func() time.Time
}

func defaultOptions() options {
	return options{
		negativeTTL: DefaultNegativeCacheTTL,
		now:         time.Now,
	}
}

// WithNegativeCacheTTL sets how long a rejected password is refused
// without asking Postgres; 0 (or less) turns the negative cache off.
func WithNegativeCacheTTL(d time.Duration) Option {
	return func(o *options) { o.negativeTTL = max(d, 0) }
}

// withClock replaces time.Now, for tests.
func withClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}
