package loginstorm

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the time source of the scheduler; tests use a fake one.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at or after when, or early with ctx's error.
	SleepUntil(ctx context.Context, when time.Time) error
}

// RealClock is the wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) SleepUntil(ctx context.Context, when time.Time) error {
	wait := time.Until(when)
	if wait <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LoginFunc performs planned login number sequence. elapsed is the time
// since the run started at which the login was planned.
type LoginFunc func(ctx context.Context, sequence int64, elapsed time.Duration) Outcome

// LateDispatchThreshold is how far behind its planned time a dispatch may
// start before the open-loop scheduler counts it as late: the generator,
// not the server, was then the limit.
const LateDispatchThreshold = 10 * time.Millisecond

// DispatchStats describes how well the open-loop scheduler kept its plan.
type DispatchStats struct {
	MaxLag        time.Duration `json:"-"`
	MaxLagSeconds float64       `json:"max_lag_seconds"`
	LateCount     int64         `json:"late_dispatches"`
}

// OpenLoop schedules planned logins at rate per second by the clock,
// independent of completions: login i is due at start + i/rate. A login due
// while maxOutstanding are in progress is not started and is reported as
// ClassSkipped, so it stays in the denominator. A generator that falls
// behind dispatches the overdue logins at once and records the lag.
// OpenLoop returns when every dispatched login has ended.
func OpenLoop(ctx context.Context, clock Clock, rate float64, planned int64, maxOutstanding int, login LoginFunc, record func(Outcome)) DispatchStats {
	var stats DispatchStats
	var outstanding atomic.Int64
	var group sync.WaitGroup
	start := clock.Now()
	interval := float64(time.Second) / rate
	for sequence := range planned {
		due := start.Add(time.Duration(float64(sequence) * interval))
		if err := clock.SleepUntil(ctx, due); err != nil {
			// Interrupted: the rest of the plan is not run; every
			// remaining planned login is skipped, never dropped.
			for rest := sequence; rest < planned; rest++ {
				record(Outcome{Sequence: rest, Class: ClassSkipped, Message: "run interrupted"})
			}
			break
		}
		lag := clock.Now().Sub(due)
		if lag > stats.MaxLag {
			stats.MaxLag = lag
		}
		if lag > LateDispatchThreshold {
			stats.LateCount++
		}
		if outstanding.Load() >= int64(maxOutstanding) {
			record(Outcome{Sequence: sequence, Class: ClassSkipped, Message: "max-outstanding reached"})
			continue
		}
		outstanding.Add(1)
		group.Add(1)
		go func() {
			defer group.Done()
			defer outstanding.Add(-1)
			record(login(ctx, sequence, due.Sub(start)))
		}()
	}
	group.Wait()
	stats.MaxLagSeconds = stats.MaxLag.Seconds()
	return stats
}

// ClosedLoop runs workers that each start a login when their previous one
// ended, until planned logins were started (planned > 0) or until duration
// has passed. Every started login is a planned one.
func ClosedLoop(ctx context.Context, clock Clock, workers int, planned int64, duration time.Duration, login LoginFunc, record func(Outcome)) {
	var next atomic.Int64
	start := clock.Now()
	end := start.Add(duration)
	var group sync.WaitGroup
	for range workers {
		group.Go(func() {
			for ctx.Err() == nil {
				now := clock.Now()
				if planned == 0 && !now.Before(end) {
					return
				}
				sequence := next.Add(1) - 1
				if planned > 0 && sequence >= planned {
					return
				}
				record(login(ctx, sequence, now.Sub(start)))
			}
		})
	}
	group.Wait()
}
