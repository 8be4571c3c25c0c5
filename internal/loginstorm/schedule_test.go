package loginstorm

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock jumps to the time asked for, plus a fixed lag that simulates a
// generator running behind its schedule.
type fakeClock struct {
	mutex sync.Mutex
	now   time.Time
	lag   time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	return c.now
}

func (c *fakeClock) SleepUntil(ctx context.Context, when time.Time) error {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	if when.Add(c.lag).After(c.now) {
		c.now = when.Add(c.lag)
	}
	return ctx.Err()
}

func TestOpenLoopBoundedOutstandingCountsSkipped(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	release := make(chan struct{})
	started := make(chan time.Duration, 100)
	login := func(ctx context.Context, sequence int64, elapsed time.Duration) Outcome {
		started <- elapsed
		<-release
		return Outcome{Sequence: sequence, Class: ClassOnTime}
	}
	collector := NewCollector()
	done := make(chan DispatchStats)
	go func() { done <- OpenLoop(context.Background(), clock, 100, 10, 3, login, collector.Record) }()
	// Nothing completes until released, so exactly 3 are dispatched and the
	// 7 others are skipped while the scheduler keeps the clock's pace.
	waitFor(t, "7 skipped", func() bool { return collector.Progress().Done == 7 })
	close(release)
	stats := <-done
	summary := collector.Summarize(time.Second, 0.99)
	if summary.Planned != 10 || summary.OnTime != 3 || summary.Failed[ClassSkipped] != 7 {
		t.Fatalf("planned %d on time %d skipped %d, want 10, 3, 7", summary.Planned, summary.OnTime, summary.Failed[ClassSkipped])
	}
	close(started)
	var offsets []time.Duration
	for elapsed := range started {
		offsets = append(offsets, elapsed)
	}
	want := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond}
	if len(offsets) != 3 {
		t.Fatalf("dispatched %d, want 3", len(offsets))
	}
	for _, offset := range want {
		found := false
		for _, got := range offsets {
			found = found || got == offset
		}
		if !found {
			t.Errorf("no dispatch planned at %s: %v", offset, offsets)
		}
	}
	if stats.LateCount != 0 || stats.MaxLag != 0 {
		t.Errorf("fake clock without lag: late %d max lag %s", stats.LateCount, stats.MaxLag)
	}
	if summary.Gate.Met {
		t.Errorf("gate met with 3 of 10 on time")
	}
}

func TestOpenLoopReportsDispatchLag(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0), lag: 15 * time.Millisecond}
	login := func(ctx context.Context, sequence int64, elapsed time.Duration) Outcome {
		return Outcome{Sequence: sequence, Class: ClassOnTime}
	}
	collector := NewCollector()
	stats := OpenLoop(context.Background(), clock, 1000, 20, 100, login, collector.Record)
	if stats.MaxLag != 15*time.Millisecond || stats.LateCount != 20 {
		t.Fatalf("max lag %s late %d, want 15ms and 20", stats.MaxLag, stats.LateCount)
	}
	if got := collector.Summarize(time.Second, 1).Planned; got != 20 {
		t.Fatalf("planned %d, want 20", got)
	}
}

func TestOpenLoopRealClockKeepsRateAndStopsWhenInterrupted(t *testing.T) {
	login := func(ctx context.Context, sequence int64, elapsed time.Duration) Outcome {
		return Outcome{Sequence: sequence, Class: ClassOnTime}
	}
	collector := NewCollector()
	start := time.Now()
	OpenLoop(context.Background(), RealClock{}, 200, 40, 10, login, collector.Record)
	if elapsed := time.Since(start); elapsed < 190*time.Millisecond {
		t.Errorf("40 logins at 200/s took %s, want about 195ms", elapsed)
	}
	if summary := collector.Summarize(time.Second, 1); summary.OnTime != 40 {
		t.Errorf("on time %d, want 40", summary.OnTime)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	collector = NewCollector()
	OpenLoop(ctx, RealClock{}, 100, 1000, 10, login, collector.Record)
	summary := collector.Summarize(time.Second, 1)
	if summary.Planned != 1000 || summary.Failed[ClassSkipped] < 900 {
		t.Errorf("interrupted: planned %d skipped %d, want 1000 and most skipped", summary.Planned, summary.Failed[ClassSkipped])
	}
}

func TestClosedLoopRunsEachPlannedLoginOnce(t *testing.T) {
	var mutex sync.Mutex
	seen := map[int64]int{}
	login := func(ctx context.Context, sequence int64, elapsed time.Duration) Outcome {
		mutex.Lock()
		seen[sequence]++
		mutex.Unlock()
		return Outcome{Sequence: sequence, Class: ClassOnTime}
	}
	collector := NewCollector()
	ClosedLoop(context.Background(), RealClock{}, 8, 100, 0, login, collector.Record)
	if len(seen) != 100 {
		t.Fatalf("%d distinct logins, want 100", len(seen))
	}
	for sequence, count := range seen {
		if count != 1 || sequence < 0 || sequence >= 100 {
			t.Fatalf("login %d ran %d times", sequence, count)
		}
	}
	collector = NewCollector()
	start := time.Now()
	ClosedLoop(context.Background(), RealClock{}, 2, 0, 30*time.Millisecond, login, collector.Record)
	if elapsed := time.Since(start); elapsed < 30*time.Millisecond || elapsed > time.Second {
		t.Errorf("closed loop for 30ms took %s", elapsed)
	}
}
