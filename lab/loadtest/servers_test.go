package loadtest

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server/config"
)

// TestNoopServer: the harness's no-op handler, on a real listener, reads
// the body under the server's bound and decides nothing.
func TestNoopServer(t *testing.T) {
	tg, err := startNoop()
	if err != nil {
		t.Fatal(err)
	}
	defer tg.close()
	post := func(path string, body []byte) int {
		t.Helper()
		resp, err := http.Post(tg.base+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := post("/v1/allow", []byte(`{"key":"client-1"}`)); c != http.StatusNoContent {
		t.Errorf("POST /v1/allow: %d, want 204", c)
	}
	if c := post("/v1/allow", bytes.Repeat([]byte("x"), int(config.DefaultMaxBodyBytes)+1)); c != http.StatusBadRequest {
		t.Errorf("oversized body: %d, want 400", c)
	}
	if c := post("/v1/noop", nil); c != http.StatusNotFound {
		t.Errorf("other path: %d, want 404", c)
	}
	resp, err := http.Get(tg.base + "/v1/allow")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
}

// TestRecordingBackend: the server the harness starts hands every
// decision to the recorder from the harness's side, and errors are not
// recorded.
func TestRecordingBackend(t *testing.T) {
	pols := []engine.Policy{{Name: "free", Limit: 2, Window: time.Hour}}
	rec := newRecorder([]string{"free"}, 10, 100)
	tg, err := startMemorySlidegate(pols, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer tg.close()
	codes := map[int]int{}
	for _, body := range []string{
		`{"key":"client-1"}`, `{"key":"client-1","cost":1}`, `{"key":"client-1"}`, // 200, 200, 429
		`{"key":"client-2","cost":3}`, // cost above the limit: 4xx, no decision
	} {
		resp, err := http.Post(tg.base+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	recs, err := rec.Records()
	if err != nil {
		t.Fatal(err)
	}
	if codes[200] != 2 || codes[429] != 1 || len(recs) != 3 || !recs[0].Allowed || !recs[1].Allowed || recs[2].Allowed {
		t.Errorf("codes %v, records %+v", codes, recs)
	}
	if v := verify(pols, recs, rec.keyName); !v.OK() || v.Records != 3 {
		t.Errorf("verification %+v", v)
	}
}

// scaleChildEnv, set, says TestScaleTiny runs in its own process.
const scaleChildEnv = "SLIDEGATE_SCALE_CHILD"

// TestScaleTiny runs scale mode at its smallest size and checks the
// figures and the page of curves.
func TestScaleTiny(t *testing.T) {
	if os.Getenv(scaleChildEnv) == "" {
		// The heap per client is the process's heap over 10,000 clients:
		// what other tests leave behind and free later (a closed server's
		// connections, a Redis client's buffers) moves it by hundreds of
		// KB, as much as the clients' rings. So the test runs in a
		// process of its own, as make loadtest-scale runs the mode.
		cmd := exec.Command(os.Args[0], "-test.run=^TestScaleTiny$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), scaleChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestScaleTiny")) {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	cfg := DefaultConfig()
	cfg.Modes = []string{ModeScale}
	cfg.ScaleMax, cfg.Limit, cfg.ScaleDecisions = scaleSizes[0], 3, 2
	// A window no run outlasts: under -race on a loaded machine the
	// population took over the default second, the first requests
	// expired before the later ones, and no ring grew.
	cfg.Window = time.Hour
	cfg.Out, cfg.Progress = t.TempDir(), "off"
	var out bytes.Buffer
	rep, err := run(context.Background(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	sc := rep.Scale
	if sc == nil || len(sc.Points) != 1 || !rep.OK {
		t.Fatalf("scale %+v ok=%v", sc, rep.OK)
	}
	p := sc.Points[0]
	if p.Clients != 10_000 || p.Heap1PerClient <= 0 || p.HeapLPerClient <= p.Heap1PerClient || p.Decisions != 20_000 || p.Allowed != 0 ||
		p.Throughput <= 0 || p.Latency.Samples == 0 || p.Latency.P99Ns < p.Latency.P50Ns {
		t.Errorf("point %+v", p)
	}
	b, err := os.ReadFile(filepath.Join(cfg.Out, "scale.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("bytes per client")) || !bytes.Contains(b, []byte("time per decision")) {
		t.Errorf("scale.html lacks a curve")
	}
	svg, err := os.ReadFile(filepath.Join(cfg.Out, "scale.svg"))
	if err != nil || bytes.Count(svg, []byte("<svg")) != 3 || !bytes.Contains(svg, []byte("<polyline")) {
		t.Errorf("scale.svg: %v\n%.300s", err, svg)
	}
	if !strings.Contains(out.String(), "scale ") {
		t.Errorf("summary:\n%s", out.String())
	}
}

func TestMonitorArgs(t *testing.T) {
	got := monitorArgs(`+1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "ab\"c" "1" "p:free:{client-1}" "a\x41\\b"` + "\r\n")
	want := []string{"EVALSHA", `ab"c`, "1", "p:free:{client-1}", `aA\b`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("monitorArgs = %q, want %q", got, want)
	}
	if monitorArgs("+OK\r\n") != nil {
		t.Error("a line without arguments gave some")
	}
}

// TestJudgeSlice: a capacity slice holds only with no error and p99
// within the bound (the bound itself holds), the reasons are named, and
// its throughput is the answers (200, 204 and 429 alike) per second from
// the first request sent to the last answer.
func TestJudgeSlice(t *testing.T) {
	res := func(p99 time.Duration, errs int) *attackResult {
		r := &attackResult{errors: errs, allowed: 2400, refused: 600}
		r.metrics.Requests = 3000 + uint64(errs)
		r.metrics.Duration, r.metrics.Wait = 290*time.Millisecond, 10*time.Millisecond
		r.metrics.Latencies.P99 = p99
		return r
	}
	for _, tc := range []struct {
		res  *attackResult
		held bool
		why  string
	}{
		{res(9*time.Millisecond, 0), true, ""},
		{res(10*time.Millisecond, 0), true, ""},
		{res(11*time.Millisecond, 0), false, "p99 11.00 ms > 10.00 ms"},
		{res(time.Millisecond, 1), false, "1 errors"},
		{&attackResult{}, false, "no request answered"},
	} {
		st := judgeSlice(tc.res, 10*time.Millisecond)
		if st.Held != tc.held || !strings.Contains(st.Why, tc.why) || (tc.held && st.Why != "") {
			t.Errorf("p99 %v errors %d: held=%v why=%q, want held=%v why %q",
				tc.res.metrics.Latencies.P99, tc.res.errors, st.Held, st.Why, tc.held, tc.why)
		}
		if tc.res.metrics.Requests > 0 && math.Abs(st.Throughput-10_000) > 1e-6 {
			t.Errorf("throughput %v, want 3000 answers over 300 ms = 10000/s", st.Throughput)
		}
		if want := map[bool]int{true: 10_000, false: 0}[tc.held]; st.capacity() != want {
			t.Errorf("held=%v: capacity %d, want %d", st.Held, st.capacity(), want)
		}
	}
}

// TestCapacityHeaders: the server the capacity phase starts sends the
// decision API's default headers (none on a 200), and the families
// --capacity-headers names (withDecisionHeaders), with their values.
func TestCapacityHeaders(t *testing.T) {
	pols := []engine.Policy{{Name: "free", Limit: 2, Window: time.Hour}}
	for _, flag := range []string{"", "draft", "x", "draft,x", "x,draft,x"} {
		c, err := parseFlags([]string{"--mode", "capacity", "--capacity-headers", flag}, io.Discard)
		if err != nil {
			t.Fatalf("--capacity-headers %q: %v", flag, err)
		}
		tg, err := startMemorySlidegate(pols, nil, withDecisionHeaders(c.CapacityHeaders...))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(tg.base+"/v1/allow", "application/json", strings.NewReader(`{"key":"a"}`))
		if err != nil {
			tg.close()
			t.Fatal(err)
		}
		resp.Body.Close()
		tg.close()
		draft, x := strings.Contains(flag, "draft"), strings.Contains(flag, "x")
		if resp.StatusCode != 200 || (resp.Header.Get("RateLimit") == `"free";r=1;t=3600`) != draft || (resp.Header.Get("RateLimit-Policy") != "") != draft ||
			(resp.Header.Get("X-RateLimit-Remaining") == "1") != x || (resp.Header.Get("X-RateLimit-Limit") != "") != x {
			t.Errorf("--capacity-headers %q: %d %v", flag, resp.StatusCode, resp.Header)
		}
	}
	for _, bad := range []string{"retry_after", "draft,X", "all"} {
		if _, err := parseFlags([]string{"--mode", "capacity", "--capacity-headers", bad}, io.Discard); err == nil || !strings.Contains(err.Error(), "--capacity-headers") {
			t.Errorf("--capacity-headers %q: %v, want an error naming the flag", bad, err)
		}
	}
}
