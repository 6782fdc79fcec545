package server_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/internal/server/config"
)

// TestGatewayResponseCost: an upstream that reports each response's cost
// in a trailer. With response_cost_header, a request admitted on cost 1
// that cost 6 is charged 5 more when its response ends: at limit 10 the
// first two requests pass (the second's rest is reserved after the first's
// entries expire) and the rest are refused. Without it, ten pass.
func TestGatewayResponseCost(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Trailer", "X-Tokens")
		_, _ = io.WriteString(w, "a completion")
		w.Header().Set("X-Tokens", "6")
	}))
	defer up.Close()
	for _, c := range []struct {
		extra string
		want  int
	}{{"response_cost_header: X-Tokens\n", 2}, {"", 10}} {
		cfg := mustParse(t, "upstream: "+up.URL+"\n"+c.extra+"key: header:X-User\npolicies:\n  - {name: tokens, limit: 10, window: 60s}\n")
		e := start(t, cfg)
		passed := 0
		for range 12 {
			req, err := http.NewRequest("POST", e.base+"/v1/complete", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-User", "alice")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				passed++
			case 429:
			default:
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		if passed != c.want {
			t.Errorf("%q: %d of 12 passed, want %d", c.extra, passed, c.want)
		}
	}
	if _, err := config.ParseConfig([]byte("response_cost_header: X-Tokens\npolicies:\n  - {name: a, limit: 1, window: 1s}\n")); err == nil || !strings.Contains(err.Error(), "needs upstream") {
		t.Errorf("without upstream: %v", err)
	}
}
