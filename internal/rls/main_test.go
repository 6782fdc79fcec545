package rls_test

import (
	"testing"

	"go.uber.org/goleak"
)

// rueidis's cluster client may leave one slot-refresh goroutine asleep for
// a few seconds after Close (it ends by itself); the Redis replay closes a
// cluster store just before the package ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
