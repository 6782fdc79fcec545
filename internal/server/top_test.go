package server_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// TestTopUnderLoad: at GOMAXPROCS 32, refusals from many clients through
// the decision API show in GET /admin/top with exact counts (fewer keys
// than counters); then clients decide and /admin/top is read while the
// server closes under them. goleak (TestMain) then finds no goroutine of
// the view left.
func TestTopUnderLoad(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(32))
	cfg := mustParse(t, "top_raw_keys: true\npolicies:\n  - {name: free, limit: 1, window: 1h}\n")
	e := start(t, cfg)
	post := func(key string) (int, error) {
		resp, err := e.client.Post(e.base+"/v1/allow", "application/json", strings.NewReader(`{"key":"`+key+`","policy":"free"}`))
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	const workers, each, keys = 32, 20, 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if code, err := post(fmt.Sprintf("k%d", (w+i)%keys)); err != nil || code != 200 && code != 429 {
					t.Errorf("allow: %d %v", code, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r := e.do("GET", e.admin+"/admin/top?policy=free&n=1000", "")
	var a topAnswer
	if err := json.Unmarshal(r.body, &a); err != nil || r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if len(a.Entries) != keys {
		t.Fatalf("%d keys listed, want %d: %+v", len(a.Entries), keys, a.Entries)
	}
	for _, en := range a.Entries {
		// Each key was sent workers*each/keys times and allowed once.
		if en.Count != workers*each/keys-1 || en.Error != 0 {
			t.Errorf("%s: count %d error %d, want %d", en.Key, en.Count, en.Error, workers*each/keys-1)
		}
	}
	// Now decide and read until the server closes.
	var sent atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if _, err := post(fmt.Sprintf("w%d-%d", w, i%64)); err != nil {
					return // closed
				}
				sent.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			resp, err := e.client.Get(e.admin + "/admin/top?n=5")
			if err != nil {
				return // closed
			}
			var a topAnswer
			err = json.NewDecoder(resp.Body).Decode(&a)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Errorf("GET /admin/top under load: %d %v", resp.StatusCode, err)
				return
			}
		}
	}()
	for deadline := time.Now().Add(time.Minute); sent.Load() < 2000 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if err := e.srv.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}
