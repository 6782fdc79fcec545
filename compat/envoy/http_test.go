package envoy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/slidegate/slidegate/internal/rls"
)

// The peer's gRPC health name and its /json endpoint, asked of both: the
// same health status, and for every method and body the same status
// code, Content-Type and (for what is refused) body.
func TestHealthAndJSONAsThePeer(t *testing.T) {
	e := needEnv(t)
	root, dir := writeRuntime(t, map[string]string{"a.yaml": "domain: j\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"})
	p := startPeer(t, e, root, nil)
	s := startSlidegate(t, dir, false, "")
	for _, svc := range []string{"ratelimit"} {
		pr, perr := healthpb.NewHealthClient(p.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		sr, serr := healthpb.NewHealthClient(s.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if perr != nil || serr != nil || pr.Status != sr.Status {
			t.Errorf("health %q: peer %v %v, slidegate %v %v", svc, pr, perr, sr, serr)
		}
	}
	hs := httptest.NewServer(rls.HTTPHandler(s.r, nil))
	defer hs.Close()
	type answer struct {
		code        int
		contentType string
		body        string
	}
	ask := func(base, method, body string) answer {
		t.Helper()
		req, err := http.NewRequest(method, base+"/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		a := answer{resp.StatusCode, resp.Header.Get("Content-Type"), string(b)}
		if a.code == 200 || a.code == 429 {
			a.body = "" // a decision: compared by its code (the JSON's spacing is the encoder's)
		}
		return a
	}
	good := `{"domain":"j","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	for _, c := range []struct{ method, body string }{
		{http.MethodPost, good}, {http.MethodGet, good}, {http.MethodPut, good}, {http.MethodPost, good},
		{http.MethodGet, ""}, {http.MethodPost, `{"domain": 5`}, {http.MethodPost, `{"domain":"j"}`}, {http.MethodPost, `{"descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`},
	} {
		pa, sa := ask("http://"+p.http, c.method, c.body), ask(hs.URL, c.method, c.body)
		if pa != sa {
			t.Errorf("%s %q: peer %+v, slidegate %+v", c.method, c.body, pa, sa)
		}
	}
}
