package topk

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
)

// Bounds of GET /admin/top's n.
const (
	DefaultEntries = 20
	MaxEntries     = 1000
)

// Report is GET /admin/top's answer.
type Report struct {
	// Window is how far back the counts reach.
	Window string `json:"window"`
	// Counters is the number of counters per epoch.
	Counters int `json:"counters"`
	// Keys says how keys are shown: "sha256", as the logs show them, or
	// "raw".
	Keys    string  `json:"keys"`
	Entries []Entry `json:"entries"`
}

// Handler answers GET ...?<param>=NAME&n=N with the keys refused most of
// one name (every name without the parameter). known reports whether a
// name exists (else 404); show maps a key to how it is shown, nil for the
// key itself; fail writes an error answer.
func Handler(t *Tracker, param string, known func(string) bool, show func(string) string,
	fail func(http.ResponseWriter, *http.Request, int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		n := DefaultEntries
		if v := q.Get("n"); v != "" {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 1 || n > MaxEntries {
				fail(w, r, http.StatusBadRequest, fmt.Errorf("n %q: want 1..%d", v, MaxEntries))
				return
			}
		}
		name := q.Get(param)
		if name != "" && !known(name) {
			fail(w, r, http.StatusNotFound, fmt.Errorf("no %s %q", param, name))
			return
		}
		rep := Report{Window: t.Window().String(), Counters: t.Counters(), Keys: "raw", Entries: t.Top(name, n)}
		if show != nil {
			rep.Keys = "sha256"
			for i := range rep.Entries {
				rep.Entries[i].Key = show(rep.Entries[i].Key)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(rep)
	}
}
