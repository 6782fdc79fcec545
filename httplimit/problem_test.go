package httplimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// TestProblemFastPathMatches: the pre-rendered refusal is byte for byte
// what WriteProblem (encoding/json) writes, headers included, for names
// that need escaping and for retry times around whole seconds.
func TestProblemFastPathMatches(t *testing.T) {
	for _, name := range []string{"free", `a"b\c<&>`, "x-y.z_1"} {
		lim, err := engine.New(engine.Policy{Name: name, Limit: 7, Window: 90*time.Second + 1})
		if err != nil {
			t.Fatal(err)
		}
		hw, err := newTierWriter(lim, HeadersAll)
		lim.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, ra := range []time.Duration{1, time.Second - 1, time.Second, time.Second + 1, 59 * time.Second, 90*time.Second + 1, 1234567 * time.Second, 0} {
			d := engine.Decision{Limit: 7, RetryAfter: ra, Reset: ra, At: 42}
			fast, slow := httptest.NewRecorder(), httptest.NewRecorder()
			r, _ := http.NewRequest("GET", "/", nil)
			hw.writeProblem(fast, r, d)
			WriteProblem(slow, r, Refusal{Policy: hw.policy, Decision: d})
			if fast.Body.String() != slow.Body.String() || fast.Code != slow.Code {
				t.Errorf("%q, retry %v:\nfast %d %s\nslow %d %s", name, ra, fast.Code, fast.Body, slow.Code, slow.Body)
			}
			for _, k := range []string{"Content-Type", "Content-Length", "X-Content-Type-Options"} {
				if fast.Header().Get(k) != slow.Header().Get(k) {
					t.Errorf("%q, retry %v: %s fast %q slow %q", name, ra, k, fast.Header().Get(k), slow.Header().Get(k))
				}
			}
		}
	}
}
