package loadtest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/lab/internal/keydist"
)

// decodeTargets draws n targets and decodes their bodies strictly as the
// server's AllowRequest.
func decodeTargets(t *testing.T, tr vegeta.Targeter, n int) []server.AllowRequest {
	t.Helper()
	out := make([]server.AllowRequest, n)
	for i := range out {
		var tgt vegeta.Target
		if err := tr(&tgt); err != nil {
			t.Fatal(err)
		}
		if tgt.Method != http.MethodPost || tgt.URL != "http://127.0.0.1:1/v1/allow" || tgt.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("target %s %s %v", tgt.Method, tgt.URL, tgt.Header)
		}
		dec := json.NewDecoder(bytes.NewReader(tgt.Body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&out[i]); err != nil {
			t.Fatalf("body %s: %v", tgt.Body, err)
		}
	}
	return out
}

func TestTargeterSpreadsClientsAndTiers(t *testing.T) {
	tiers := []string{"free", "pro", "team"}
	const clients, n = 50, 100_000
	tr, err := newTargeter("http://127.0.0.1:1/", tiers, Config{Clients: clients, Dist: keydist.Uniform, Seed: 1, MaxCost: 3})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, clients)
	tierCounts := map[string]int{}
	costs := map[int]int{}
	for _, req := range decodeTargets(t, tr, n) {
		i, ok := clientIndex(req.Key)
		if !ok || i >= clients {
			t.Fatalf("key %q is not one of %d clients", req.Key, clients)
		}
		if req.Policy != tiers[i%len(tiers)] {
			t.Fatalf("client %d in tier %q, want %q", i, req.Policy, tiers[i%len(tiers)])
		}
		counts[i]++
		tierCounts[req.Policy]++
		costs[*req.Cost]++
	}
	want := float64(n) / clients
	chi2 := 0.0
	for _, c := range counts {
		chi2 += (float64(c) - want) * (float64(c) - want) / want
	}
	if chi2 > 90 { // 49 degrees of freedom: P(chi2 > 90) < 0.1%
		t.Errorf("keys not uniform: chi-square %.1f", chi2)
	}
	// 17, 17 and 16 clients per tier.
	if tierCounts["free"] < 30_000 || tierCounts["team"] < 28_000 {
		t.Errorf("tiers %v", tierCounts)
	}
	if len(costs) != 3 || costs[0] != 0 || costs[4] != 0 {
		t.Errorf("costs %v, want 1..3", costs)
	}
}

func TestTargeterZipf(t *testing.T) {
	tr, err := newTargeter("http://127.0.0.1:1", []string{"free"}, Config{Clients: 1000, Dist: keydist.Zipf, ZipfS: 1.1, Seed: 1, MaxCost: 1})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, req := range decodeTargets(t, tr, 50_000) {
		counts[req.Key]++
	}
	// Client 0 is the hottest, client 1 next: P(0)/P(1) = 2^1.1 ≈ 2.14.
	r := float64(counts[clientKey(0)]) / float64(counts[clientKey(1)])
	if r < 1.9 || r > 2.4 {
		t.Errorf("client 0 / client 1 = %.2f, want about 2.14", r)
	}
}

func TestTargeterConcurrent(t *testing.T) {
	tr, err := newTargeter("http://127.0.0.1:1", []string{"free"}, Config{Clients: 100, Dist: keydist.Zipf, ZipfS: 1.1, Seed: 1, MaxCost: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				var tgt vegeta.Target
				if err := tr(&tgt); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
