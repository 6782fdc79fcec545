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

// TestServeSIGHUPKeepsOverriddenKeysState runs slidegate serve as a real
// process with per-key limits: tenant-a at its override of 4, SIGHUP that
// changes only tenant-b's override leaves it refused; SIGHUP that raises
// tenant-a's to 6 gives it exactly 2 more; a key without an override is
// untouched throughout.
func TestServeSIGHUPKeepsOverriddenKeysState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	path := filepath.Join(t.TempDir(), "slidegate.yaml")
	write := func(overrides string) {
		t.Helper()
		yaml := "policies:\n  - {name: free, limit: 2, window: 1h, overrides: {" + overrides + "}}\n"
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`tenant-a: 4, tenant-b: 1`)
	h := startHelper(t, nil, "--config", path, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	allowed := func(key string, n int) (got, limit int) {
		t.Helper()
		for range n {
			resp, err := c.Post("http://"+h.listen+"/v1/allow", "application/json", strings.NewReader(`{"key":"`+key+`"}`))
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
	reload := func(overrides string) {
		t.Helper()
		write(overrides)
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
	for _, s := range []struct {
		key          string
		want, limit  int
		overridesNow string // reloaded before this step, if set
	}{
		{"tenant-a", 4, 4, ""},
		{"plain", 2, 2, ""},
		{"tenant-a", 0, 4, `tenant-a: 4, tenant-b: 3`}, // only tenant-b's changed
		{"tenant-a", 2, 6, `tenant-a: 6, tenant-b: 3`}, // raised by 2
		{"plain", 0, 2, ""},
	} {
		if s.overridesNow != "" {
			reload(s.overridesNow)
		}
		if got, limit := allowed(s.key, 6); got != s.want || limit != s.limit {
			t.Fatalf("%s after %q: %d of 6 allowed at limit %d, want %d at %d", s.key, s.overridesNow, got, limit, s.want, s.limit)
		}
	}
	if l := h.logs(); !strings.Contains(l, "policy overrides changed in place; its keys keep their state") {
		t.Errorf("the in-place change was not logged:\n%s", l)
	}
}
