package server_test

// Tests of the server's life: reload, drain, connection cap, build
// information. All through real listeners.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
	"github.com/slidegate/slidegate/internal/server"
	"github.com/slidegate/slidegate/internal/server/config"
)

// TestReload (point 9): unchanged policies keep their state, and so do
// ones whose limit changed; new ones start fresh, removed ones are gone, a bad configuration
// changes nothing, and both outcomes are counted.
func TestReload(t *testing.T) {
	clk := engine.NewManualClock()
	cfg := mustParse(t, `
policies:
  - {name: free, limit: 2, window: 60s}
  - {name: paid, limit: 3, window: 60s}
  - {name: old, limit: 3, window: 60s}
`)
	e := start(t, cfg, server.WithClock(clk))
	for range 2 {
		e.allow(`{"key":"a"}`)
	}
	e.allow(`{"key":"a","policy":"paid","cost":3}`)
	oldBackend, _ := e.srv.Backend("old")

	next := mustParse(t, `
max_batch: 2
policies:
  - {name: free, limit: 2, window: 60s}
  - {name: paid, limit: 5, window: 60s}
  - {name: gold, limit: 9, window: 60s}
`)
	if err := e.srv.Reload(next); err != nil {
		t.Fatal(err)
	}
	if r, d := e.allow(`{"key":"a"}`); r.status != 429 || d.Limit != 2 {
		t.Errorf("free is unchanged and should have kept a's two requests: %d %+v", r.status, d)
	}
	if r, d := e.allow(`{"key":"a","policy":"paid","cost":5}`); r.status != 429 || d.Limit != 5 || d.Remaining != 2 {
		t.Errorf("paid changed its limit and keeps a's 3 requests: %d %+v", r.status, d)
	}
	if r, d := e.allow(`{"key":"a","policy":"paid","cost":2}`); r.status != 200 || d.Remaining != 0 {
		t.Errorf("paid at limit 5 with 3 used: %d %+v", r.status, d)
	}
	if r, d := e.allow(`{"key":"a","policy":"gold"}`); r.status != 200 || d.Remaining != 8 {
		t.Errorf("gold is new: %d %+v", r.status, d)
	}
	if r := e.do("POST", e.base+"/v1/allow", `{"key":"a","policy":"old"}`); r.status != 400 {
		t.Errorf("old was removed: %d %s", r.status, r.body)
	}
	if r := e.do("POST", e.base+"/v1/allow/batch", `[{"key":"x"},{"key":"y"},{"key":"z"}]`); r.status != 413 {
		t.Errorf("max_batch 2 after the reload: %d", r.status)
	}

	bad := next
	bad.DefaultPolicy = "nope"
	if err := e.srv.Reload(bad); err == nil || !errors.Is(err, server.ErrReload) || !strings.Contains(err.Error(), "default_policy") {
		t.Errorf("bad reload: %v", err)
	}
	if r, d := e.allow(`{"key":"b","policy":"gold"}`); r.status != 200 || d.Limit != 9 {
		t.Errorf("after a bad reload the previous configuration should serve: %d %+v", r.status, d)
	}
	if err := e.srv.ReloadFrom(func() (config.Config, error) { return config.Config{}, errors.New("config: line 3: oops") }); err == nil {
		t.Error("ReloadFrom passed a load error on")
	}
	restart := next
	restart.Listen = "127.0.0.1:1"
	if err := e.srv.Reload(restart); err != nil {
		t.Errorf("a reload that changes listen (restart-only) should apply the rest: %v", err)
	}
	if got := e.srv.Config().Listen; got != "127.0.0.1:0" {
		t.Errorf("listen after reload: %q; restart-only settings are kept", got)
	}
	if err := testutil.GatherAndCompare(e.srv.Registry(), strings.NewReader(`
# HELP slidegate_config_reloads_total Configuration reloads, by surface and result (success, failure).
# TYPE slidegate_config_reloads_total counter
slidegate_config_reloads_total{result="failure",surface="http"} 2
slidegate_config_reloads_total{result="success",surface="http"} 2
`), server.MetricReloads); err != nil {
		t.Error(err)
	}
	// The retired backend was closed (its sweeper is gone: goleak checks
	// at the end); a closed engine limiter still decides.
	if _, err := oldBackend.Decide(context.Background(), "z", 1); err != nil {
		t.Error(err)
	}
}

// TestReloadStress: reloads in a tight loop (alternating the limit of one
// policy, keeping another) while many goroutines decide through the real
// listener. No request may fail, and every decision of the kept policy,
// rebuilt from the responses, replays exactly through the reference log.
func TestReloadStress(t *testing.T) {
	for _, procs := range []int{2, 8, 32} {
		t.Run(fmt.Sprint("GOMAXPROCS=", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			const base = `
policies:
  - {name: kept, limit: 5, window: 3ms}
  - {name: churn, limit: %d, window: 1ms}
`
			e := start(t, mustParse(t, fmt.Sprintf(base, 3)))
			stop := make(chan struct{})
			var reloads atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					cfg := mustParse(t, fmt.Sprintf(base, 3+i%2))
					if err := e.srv.Reload(cfg); err != nil {
						t.Errorf("reload: %v", err)
						return
					}
					reloads.Add(1)
				}
			}()
			var mu sync.Mutex
			var recs []reference.Record
			const workers, each = 8, 150
			var dwg sync.WaitGroup
			for w := range workers {
				dwg.Add(1)
				go func() {
					defer dwg.Done()
					for i := range each {
						key := fmt.Sprint("k", (w+i)%3)
						policy := []string{"kept", "churn"}[i%2]
						body := fmt.Sprintf(`{"key":%q,"policy":%q}`, key, policy)
						req, _ := http.NewRequest("POST", e.base+"/v1/allow", strings.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						resp, err := e.client.Do(req)
						if err != nil {
							t.Errorf("request: %v", err)
							return
						}
						var ar server.AllowResponse
						err = json.NewDecoder(resp.Body).Decode(&ar)
						resp.Body.Close()
						if err != nil || (resp.StatusCode != 200 && resp.StatusCode != 429) {
							t.Errorf("status %d during reloads: %v", resp.StatusCode, err)
							return
						}
						if policy == "kept" {
							mu.Lock()
							recs = append(recs, reference.Record{Key: key, Cost: 1, At: ar.At, Allowed: ar.Allowed,
								Remaining: ar.Remaining, RetryAfter: ar.RetryAfterNs, Reset: ar.ResetNs})
							mu.Unlock()
						}
					}
				}()
			}
			dwg.Wait()
			close(stop)
			wg.Wait()
			if reloads.Load() == 0 {
				t.Fatal("no reload ran")
			}
			rep := reference.VerifyLog(5, int64(3*time.Millisecond), recs)
			if !rep.OK() {
				t.Errorf("kept policy across %d reloads: %v", reloads.Load(), rep)
			}
		})
	}
}

// TestDrain (point 9): after the context ends, /readyz answers 503 while
// requests are still served; Hurry ends the delay, and Run returns nil.
func TestDrain(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 100, window: 60s}\n")
	d := config.Duration(time.Hour) // only Hurry can end it
	cfg.DrainDelay = &d
	s, cancel, runErr := run(t, cfg)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func(url string) int {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get("http://" + s.AdminAddr() + "/readyz"); st != 200 {
		t.Fatalf("/readyz before the drain: %d", st)
	}
	cancel()
	for get("http://"+s.AdminAddr()+"/readyz") != 503 {
		time.Sleep(time.Millisecond)
	}
	resp, err := c.Post("http://"+s.Addr()+"/v1/allow", "application/json", strings.NewReader(`{"key":"a"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a request during the drain: %v %v", resp, err)
	}
	resp.Body.Close()
	if !resp.Close {
		t.Error("a response during the drain did not say Connection: close")
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned during the drain delay: %v", err)
	default:
	}
	s.Hurry()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestMaxConns (point 10): with max_conns 2 and two connections busy
// (each in the middle of its first request's headers; idle ones would be
// closed first), a third client is not served until one closes. Each
// client has its own loopback address, so that max_conns_per_ip (at most
// half of max_conns) does not turn the second away.
func TestMaxConns(t *testing.T) {
	cfg := mustParse(t, "max_conns: 2\nread_timeout: 1m\nread_header_timeout: 1m\npolicies:\n  - {name: free, limit: 100, window: 60s}\n")
	e := start(t, cfg)
	addr := strings.TrimPrefix(e.base, "http://")
	const req = "POST /v1/allow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"key\":\"a\"}"
	from := 1
	open := func() (net.Conn, *bufio.Reader) {
		from++
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(from))}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c, bufio.NewReader(c)
	}
	roundTrip := func(c net.Conn, br *bufio.Reader, deadline time.Duration) error {
		_ = c.SetDeadline(time.Now().Add(deadline))
		if _, err := io.WriteString(c, req); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	c1, br1 := open()
	defer c1.Close()
	c2, br2 := open()
	defer c2.Close()
	for _, c := range []struct {
		c  net.Conn
		br *bufio.Reader
	}{{c1, br1}, {c2, br2}} {
		if _, err := io.WriteString(c.c, "POST /v1/allow HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if m := e.do("GET", e.admin+"/metrics", ""); strings.Contains(string(m.body), `slidegate_open_connections{listener="main"} 2`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/metrics: open connections of the main listener should be 2")
		}
	}
	c3, br3 := open() // the kernel accepts it; the server does not yet
	defer c3.Close()
	var ne net.Error
	if err := roundTrip(c3, br3, 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a third connection was served while max_conns (2) were open: %v", err)
	}
	c1.Close()
	// The request already written is answered once a slot frees.
	_ = c3.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br3, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the third connection after one closed: %v %v", resp, err)
	}
	resp.Body.Close()
}

// TestBuildInfo (point 11): slidegate_build_info carries what the binary
// was built as.
func TestBuildInfo(t *testing.T) {
	e := start(t, mustParse(t, "policies:\n  - {name: free, limit: 1, window: 60s}\n"),
		server.WithBuildInfo(server.BuildInfo{Version: "v1.2.3", Commit: "abc123", Date: "2026-12-01T00:00:00Z"}))
	want := fmt.Sprintf(`
# HELP slidegate_build_info Always 1; the labels describe the running slidegate binary.
# TYPE slidegate_build_info gauge
slidegate_build_info{commit="abc123",date="2026-12-01T00:00:00Z",goversion=%q,version="v1.2.3"} 1
`, runtime.Version())
	if err := testutil.GatherAndCompare(e.srv.Registry(), strings.NewReader(want), server.MetricBuildInfo); err != nil {
		t.Error(err)
	}
	r := e.do("GET", e.admin+"/metrics", "")
	if !strings.Contains(string(r.body), `slidegate_build_info{commit="abc123"`) {
		t.Errorf("/metrics lacks slidegate_build_info")
	}
}

// TestDrainStages (point 9): each Hurry moves the drain one stage on: the
// first ends the delay and closes the listeners, the second stops waiting
// for an in-flight request and cuts it off.
func TestDrainStages(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer close(release)
	cfg := mustParse(t, "key: header:X-Client\npolicies:\n  - {name: free, limit: 100, window: 60s}\n")
	cfg.Upstream = config.UpstreamURL(up)
	d := config.Duration(time.Hour)
	cfg.DrainDelay = &d
	s, cancel, runErr := run(t, cfg)
	defer cancel()
	addr := s.Addr()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	inFlight := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+addr+"/slow", nil)
		req.Header.Set("X-Client", "c")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		inFlight <- err
	}()
	<-arrived
	cancel()
	s.Hurry() // ends the hour-long delay: the listener closes
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-runErr:
		t.Fatalf("Run returned with a request in flight: %v", err)
	default:
	}
	s.Hurry() // stop waiting for it
	if err := <-runErr; err == nil || !strings.Contains(err.Error(), "shutdown") {
		t.Errorf("Run after cutting off a request: %v, want a shutdown error", err)
	}
	if err := <-inFlight; err == nil {
		t.Error("the cut-off request got a whole answer")
	}
}

// TestDrainUnderLoad (point 9): clients behind a load balancer that
// polls /readyz keep sending until it reports 503, then send no more; with
// the drain delay, every request they sent gets its full answer (without
// it, the listener closed as /readyz turned, and requests in flight or in
// the accept queue failed with EOF or a reset).
func TestDrainUnderLoad(t *testing.T) {
	cfg := mustParse(t, "policies:\n  - {name: free, limit: 1000000, window: 60s}\n")
	// The drain lasts until the balancer has taken the instance out and
	// the clients have stopped (Hurry below), as an operator sizes
	// drain_delay: a fixed delay shorter than the balancer's reaction on a
	// loaded machine would close the listeners under requests it still
	// sends.
	d := config.Duration(time.Hour)
	cfg.DrainDelay = &d
	s, cancel, runErr := run(t, cfg)
	defer cancel()
	url := "http://" + s.Addr() + "/v1/allow"
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	// The load balancer: polls /readyz every millisecond and takes the
	// instance out of rotation at the first 503.
	var inRotation atomic.Bool
	inRotation.Store(true)
	lbDone := make(chan struct{})
	go func() {
		defer close(lbDone)
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		for {
			resp, err := hc.Get("http://" + s.AdminAddr() + "/readyz")
			if err != nil || resp.StatusCode != 200 {
				if err == nil {
					resp.Body.Close()
				}
				inRotation.Store(false)
				return
			}
			resp.Body.Close()
			time.Sleep(time.Millisecond)
		}
	}()
	var ok atomic.Int64
	var wg sync.WaitGroup
	var failed sync.Map
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for inRotation.Load() {
				resp, err := c.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"key":"w%d"}`, w)))
				if err != nil {
					failed.Store(err.Error(), true)
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					failed.Store(fmt.Sprint(resp.StatusCode, err), true)
					return
				}
				if ok.Add(1) == 200 {
					cancel() // SIGTERM, while the clients keep going
				}
			}
		}()
	}
	wg.Wait()
	<-lbDone
	s.Hurry()
	// Out of rotation, the balancer lets go of its pooled connections;
	// otherwise one it dialed but never used would hold Shutdown for the
	// 5 s net/http gives a new connection to send its first request.
	tr.CloseIdleConnections()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	failed.Range(func(k, _ any) bool { t.Errorf("a request failed: %v", k); return true })
	if ok.Load() < 200 {
		t.Errorf("%d answered", ok.Load())
	}
}
