package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rpdoc "github.com/slidegate/slidegate/lab/internal/redispeersdoc"
)

func standalone(t *testing.T) deployment {
	a := os.Getenv("SLIDEGATE_REDIS_ADDR")
	if a == "" {
		t.Fatal("SLIDEGATE_REDIS_ADDR is not set: run through scripts/redis-env.sh (make test-peers does)")
	}
	return deployment{name: "one server", addrs: []string{a}}
}

// TestAdapters: every peer decides through its own client on a real
// Redis; on a fresh key with L = 3 the exact ones admit exactly 3 of 10,
// and every peer admits at least 3 (their bursts allow L at once).
func TestAdapters(t *testing.T) {
	d := standalone(t)
	ctx := context.Background()
	for _, p := range peers {
		t.Run(p.name, func(t *testing.T) {
			l, err := p.open(d, 3, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			key := fmt.Sprintf("adapter-%s-%d", strings.ReplaceAll(p.name, " ", "-"), time.Now().UnixNano())
			admitted := 0
			for range 10 {
				ok, err := l.Allow(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					admitted++
				}
			}
			if admitted < 3 || (p.exact && admitted != 3) {
				t.Errorf("admitted %d of 10 at L = 3 (exact: %v)", admitted, p.exact)
			}
		})
	}
}

// TestRunReport: a short run of two peers prints a table per workload,
// with the exact peers never over L.
func TestRunReport(t *testing.T) {
	standalone(t)
	var out, errb bytes.Buffer
	jsonPath := filepath.Join(t.TempDir(), "r.json")
	code := run([]string{"-duration", "200ms", "-rounds", "1", "-callers", "8", "-limit", "5",
		"-workloads", "hot", "-deployments", "standalone", "-peers", "slidegate,sorted set", "-json", jsonPath}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	table := out.String()
	// -json holds the settings, the printed table and every cell.
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc rpdoc.Doc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Table != table || len(doc.Cells) != 2 || doc.Callers != 8 || doc.Limit != 5 || doc.Rounds != 1 ||
		doc.CellNs != int64(200*time.Millisecond) || doc.WindowNs != int64(time.Minute) {
		t.Errorf("-json: %+v\nthe table printed:\n%s", doc, table)
	}
	for _, want := range []string{"### one server, one hot key", "| slidegate | sliding log |", "| sorted set |"} {
		if !strings.Contains(table, want) {
			t.Errorf("no %q in:\n%s", want, table)
		}
	}
	if strings.Contains(table, "over L") {
		t.Errorf("an exact limiter went over L:\n%s", table)
	}
	if code := run([]string{"-workloads", "nope"}, &out, &errb); code != 2 {
		t.Errorf("an unknown workload: exit %d, want 2", code)
	}
}
