package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestServeSIGHUPKeepsAChangedPolicysState runs slidegate serve as a real
// process: limit 10 with 10 used, SIGHUP to limit 5 allows nothing more,
// SIGHUP back to 10 nothing more in the same window; SIGHUP to another
// algorithm starts the policy empty, and the log says which happened.
func TestServeSIGHUPKeepsAChangedPolicysState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	path := filepath.Join(t.TempDir(), "slidegate.yaml")
	write := func(limit, alg string) {
		t.Helper()
		yaml := "policies:\n  - {name: free, limit: " + limit + ", window: 1h, algorithm: " + alg + "}\n"
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10", "log")
	h := startHelper(t, nil, "--config", path, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	allowed := func(n int) (got, limit int) {
		t.Helper()
		for range n {
			resp, err := c.Post("http://"+h.listen+"/v1/allow", "application/json", strings.NewReader(`{"key":"abuser"}`))
			if err != nil {
				t.Fatal(err)
			}
			var d struct {
				Allowed bool `json:"allowed"`
				Limit   int  `json:"limit"`
			}
			err = json.NewDecoder(resp.Body).Decode(&d)
			resp.Body.Close()
			if err != nil || (resp.StatusCode != 200 && resp.StatusCode != 429) {
				t.Fatalf("status %d: %v", resp.StatusCode, err)
			}
			if d.Allowed {
				got++
			}
			limit = d.Limit
		}
		return got, limit
	}
	reloads := 0
	reload := func(limit, alg string) {
		t.Helper()
		write(limit, alg)
		if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		reloads++
		want := `slidegate_config_reloads_total{result="success",surface="http"} ` + strconv.Itoa(reloads)
		waitFor(t, "the reload to be counted", func() bool {
			resp, err := c.Get("http://" + h.admn + "/metrics")
			if err != nil {
				return false
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return strings.Contains(string(b), want)
		})
	}
	if got, _ := allowed(10); got != 10 {
		t.Fatalf("%d of the first 10 allowed", got)
	}
	reload("5", "log")
	if got, limit := allowed(10); got != 0 || limit != 5 {
		t.Fatalf("after SIGHUP to limit 5: %d more allowed (limit %d), want 0", got, limit)
	}
	reload("10", "log")
	if got, limit := allowed(10); got != 0 || limit != 10 {
		t.Fatalf("after SIGHUP back to limit 10: %d more allowed (limit %d), want 0 in the same window", got, limit)
	}
	if l := h.logs(); !strings.Contains(l, "policy changed in place; its keys keep their state") {
		t.Errorf("the in-place change was not logged:\n%s", l)
	}
	reload("10", "counter")
	if got, _ := allowed(12); got != 10 {
		t.Fatalf("after SIGHUP to the counter: %d of 12 allowed, want a fresh 10", got)
	}
	if l := h.logs(); !strings.Contains(l, "policy changed; its keys start empty") {
		t.Errorf("the reset was not logged:\n%s", l)
	}
}
