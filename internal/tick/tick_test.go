package tick

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/slidegate/slidegate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// TestEvery: f runs once per interval, first one interval after the
// start, and Every returns once stop is closed, calling f no more.
func TestEvery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var calls []time.Duration
		stop, returned := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(returned)
			Every(stop, time.Second, func() { calls = append(calls, time.Since(start)) })
		}()
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		close(stop)
		<-returned
		if want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}; !slices.Equal(calls, want) {
			t.Fatalf("f ran at %v, want %v", calls, want)
		}
		time.Sleep(5 * time.Second)
		if len(calls) != 3 {
			t.Errorf("f ran %d times after stop was closed", len(calls)-3)
		}
	})
}
