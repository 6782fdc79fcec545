package loadtest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests. rueidis's cluster
// client, after a topology refresh, closes the old connections from a
// goroutine that first sleeps 5 s (cluster.go, _refresh); it ends by
// itself, as redisstore's and cmd/slidegate's tests also allow.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}
