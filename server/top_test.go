package server_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
)

type topAnswer struct {
	Window   string `json:"window"`
	Counters int    `json:"counters"`
	Keys     string `json:"keys"`
	Entries  []struct {
		Name  string `json:"name"`
		Key   string `json:"key"`
		Count uint64 `json:"count"`
		Error uint64 `json:"error"`
	} `json:"entries"`
}

func logKey(k string) string {
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// TestAdminTop: refusals through the decision API and the check endpoint
// show in GET /admin/top, per policy, with exact counts (fewer keys than
// counters), keys as the logs show them; allowed requests count nothing.
func TestAdminTop(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 2, window: 60s}\n  - {name: paid, limit: 5, window: 60s}\n")
	e := start(t, cfg)
	send := func(policy, key string, times int) {
		for range times {
			if r, _ := e.allow(fmt.Sprintf(`{"key":%q,"policy":%q}`, key, policy)); r.status != 200 && r.status != 429 {
				t.Fatalf("allow: %d %s", r.status, r.body)
			}
		}
	}
	send("free", "mallory", 12) // 2 allowed, 10 refused
	send("free", "eve", 5)      // 3 refused
	send("free", "alice", 2)    // none refused
	send("paid", "mallory", 6)  // 1 refused
	get := func(query string) (int, topAnswer) {
		t.Helper()
		r := e.do("GET", e.admin+"/admin/top"+query, "")
		var a topAnswer
		if r.status == 200 {
			if err := json.Unmarshal(r.body, &a); err != nil {
				t.Fatalf("%s: %v", r.body, err)
			}
		}
		return r.status, a
	}
	status, a := get("?policy=free")
	if status != 200 {
		t.Fatalf("GET /admin/top: %d", status)
	}
	if a.Keys != "sha256" || a.Counters < 8 || a.Window == "" {
		t.Fatalf("report header: %+v", a)
	}
	want := []struct {
		key   string
		count uint64
	}{{"mallory", 10}, {"eve", 3}}
	if len(a.Entries) != len(want) {
		t.Fatalf("free's entries: %+v, want %v", a.Entries, want)
	}
	for i, w := range want {
		got := a.Entries[i]
		if got.Name != "free" || got.Key != logKey(w.key) || got.Count != w.count || got.Error != 0 {
			t.Errorf("entry %d: %+v, want %s (%s) with %d", i, got, w.key, logKey(w.key), w.count)
		}
	}
	if _, all := get("?n=1"); len(all.Entries) != 1 || all.Entries[0].Key != logKey("mallory") || all.Entries[0].Name != "free" {
		t.Fatalf("n=1 over every policy: %+v", all.Entries)
	}
	if _, paid := get("?policy=paid"); len(paid.Entries) != 1 || paid.Entries[0].Count != 1 {
		t.Fatalf("paid: %+v", paid.Entries)
	}
	for _, q := range []string{"?n=0", "?n=x", "?n=1001"} {
		if status, _ := get(q); status != 400 {
			t.Errorf("%s: %d, want 400", q, status)
		}
	}
	if status, _ := get("?policy=nope"); status != 404 {
		t.Errorf("unknown policy: %d, want 404", status)
	}
}

// TestAdminTopRawKeys: with top_raw_keys the keys themselves are shown.
func TestAdminTopRawKeys(t *testing.T) {
	cfg := mustParse(t, "top_raw_keys: true\npolicies:\n  - {name: free, limit: 1, window: 60s}\n")
	e := start(t, cfg)
	for range 3 {
		e.allow(`{"key":"10.0.0.7","policy":"free"}`)
	}
	r := e.do("GET", e.admin+"/admin/top", "")
	var a topAnswer
	if err := json.Unmarshal(r.body, &a); err != nil || r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if a.Keys != "raw" || len(a.Entries) != 1 || a.Entries[0].Key != "10.0.0.7" || a.Entries[0].Count != 2 {
		t.Fatalf("%+v", a)
	}
}
