package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	rulesFile     = "prometheus/slidegate.rules.yml"
	rulesTestFile = "prometheus/slidegate.rules_test.yml"
	dashboardFile = "grafana/slidegate.json"
)

// needProm returns the path of a tool the Prometheus tests run
// (prometheus, promtool, redis-server). A missing one fails the test
// unless SLIDEGATE_SKIP_PROMETHEUS is set, which skips it saying so.
func needProm(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err == nil {
		return p
	}
	if os.Getenv("SLIDEGATE_SKIP_PROMETHEUS") != "" {
		t.Skipf("%s is not installed and SLIDEGATE_SKIP_PROMETHEUS is set: skipped", tool)
	}
	t.Fatalf("%s is not installed: run the test under scripts/proxy-env.sh, which installs it with apt (Debian's prometheus provides promtool), or set SLIDEGATE_SKIP_PROMETHEUS=1 to skip it", tool)
	return ""
}

// TestPromtoolRules: the alerting rules are valid, and each alert fires
// on the fixtures that should fire it and on no others (promtool's own
// rule unit tests).
func TestPromtoolRules(t *testing.T) {
	promtool := needProm(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(rulesFile)},
		{"test", "rules", filepath.Base(rulesTestFile)},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Dir(rulesFile)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// dashboardExprs returns every query of the Grafana dashboard, by panel
// title, after checking the panels' shape.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			ID         int    `json:"id"`
			Title      string `json:"title"`
			Type       string `json:"type"`
			Datasource struct {
				Type string `json:"type"`
			} `json:"datasource"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(readFile(t, dashboardFile)), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: no title, uid or panels", dashboardFile)
	}
	exprs := map[string]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.Title == "" || p.Datasource.Type != "prometheus" || len(p.Targets) == 0 {
			t.Errorf("panel %d %q: want a unique id, a title, the prometheus data source and a query", p.ID, p.Title)
		}
		ids[p.ID] = true
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" {
				t.Errorf("panel %q: a target without expr or refId", p.Title)
			}
			exprs[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	return exprs
}

// threshold splits an alert's expression, <signal> <comparison>
// <number>, as every rule of the file is written.
var threshold = regexp.MustCompile(`^(?s)(.*\S)\s*(>=|<=|==|!=|>|<)\s*([0-9.eE+-]+)\s*$`)

// alertExprs returns, by alert name, each alert's expression with its
// comparison made a bool one: it returns the signal's series (0 or 1),
// firing or not, so that an expression naming a metric or a label no
// server exports is seen.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	// The file keeps each rule's alert and expr on one line each: a YAML
	// reader is not a dependency of this module.
	exprs := map[string]string{}
	alert := ""
	for _, line := range strings.Split(readFile(t, rulesFile), "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "- alert: "); ok {
			alert = v
			continue
		}
		v, ok := strings.CutPrefix(line, "expr: ")
		if !ok {
			continue
		}
		m := threshold.FindStringSubmatch(v)
		if alert == "" || m == nil {
			t.Fatalf("rule %q: want an alert whose expression is <signal> <comparison> <number> on one line: %s", alert, v)
		}
		exprs["alert "+alert] = fmt.Sprintf("(%s) %s bool %s", m[1], m[2], m[3])
		alert = ""
	}
	if len(exprs) != 7 {
		t.Fatalf("%d alerts, want the 7 documented ones", len(exprs))
	}
	return exprs
}

// TestDashboardAndAlertsLive runs Debian's prometheus against a live
// slidegate serve (on a real Redis) and a live slidegate envoy serve (on
// the memory store), sends them a little traffic, and evaluates every
// dashboard query and every alert's signal through Prometheus's HTTP API:
// each must return series. The rules file is loaded by Prometheus too,
// and every rule must evaluate without error. Last, envoy serve reloads
// its changed rules and keeps its counters.
func TestDashboardAndAlertsLive(t *testing.T) {
	prom := needProm(t, "prometheus")
	redisServer := needProm(t, "redis-server")
	exprs := dashboardExprs(t)
	for k, v := range alertExprs(t) {
		exprs[k] = v
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "slidegate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/slidegate")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	logs := func(b *syncBuf) func() string { return b.String }

	// Redis, for the store metrics (breaker, fallback, call time).
	var redisLog syncBuf
	redisAddr := startOn(t, func(listen string) (<-chan struct{}, func() string) {
		_, port, _ := net.SplitHostPort(listen)
		cmd := exec.Command(redisServer, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", dir)
		cmd.Stdout, cmd.Stderr = &redisLog, &redisLog
		return run(t, cmd), logs(&redisLog)
	})

	// slidegate serve on Redis; its admin listener serves /metrics.
	var serveLog syncBuf
	var serveAddr string
	adminAddr := startOn(t, func(admin string) (<-chan struct{}, func() string) {
		serveAddr = freeAddr(t)
		cfg := filepath.Join(dir, "serve.yaml")
		writeFileT(t, cfg, fmt.Sprintf("listen: %s\nadmin: %s\nstore: redis://%s/0\npolicies:\n  - {name: free, limit: 3, window: 60s}\n  - {name: paid, limit: 100, window: 60s}\n", serveAddr, admin, redisAddr))
		cmd := exec.Command(bin, "serve", "--config", cfg)
		cmd.Stdout, cmd.Stderr = &serveLog, &serveLog
		return run(t, cmd), logs(&serveLog)
	})
	if err := listening(serveAddr, make(chan struct{})); err != nil {
		t.Fatalf("slidegate serve: %v\n%s", err, serveLog.String())
	}

	// slidegate envoy serve on memory, one key per rule at most.
	rt := filepath.Join(dir, "envoy")
	writeFileT(t, filepath.Join(rt, "edge.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	var envoyLog syncBuf
	var grpcAddr string
	envoyHTTP := startOn(t, func(listen string) (<-chan struct{}, func() string) {
		grpcAddr = freeAddr(t)
		gh, gp, _ := net.SplitHostPort(grpcAddr)
		hh, hp, _ := net.SplitHostPort(listen)
		cmd := exec.Command(bin, "envoy", "serve", "--config", rt, "--grpc-host", gh, "--grpc-port", gp, "--host", hh, "--port", hp, "--max-keys", "1")
		cmd.Env = append(os.Environ(), "USE_STATSD=false")
		cmd.Stdout, cmd.Stderr = &envoyLog, &envoyLog
		return run(t, cmd), logs(&envoyLog)
	})
	if err := listening(grpcAddr, make(chan struct{})); err != nil {
		t.Fatalf("slidegate envoy serve: %v\n%s", err, envoyLog.String())
	}

	// Prometheus, scraping both every second and evaluating the rules.
	abs, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	promCfg := filepath.Join(dir, "prometheus.yml")
	writeFileT(t, promCfg, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: slidegate
    static_configs: [{targets: ['%s']}]
  - job_name: envoy-rls
    static_configs: [{targets: ['%s']}]
`, abs, adminAddr, envoyHTTP))
	var promLog syncBuf
	promAddr := startOn(t, func(listen string) (<-chan struct{}, func() string) {
		cmd := exec.Command(prom, "--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
			"--web.listen-address="+listen, "--log.level=warn")
		cmd.Stdout, cmd.Stderr = &promLog, &promLog
		return run(t, cmd), logs(&promLog)
	})

	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	query := func(q string) ([]promSample, error) {
		resp, err := hc.Get("http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []promSample `json:"result"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return nil, err
		}
		if r.Status != "success" {
			return nil, fmt.Errorf("%s", r.Error)
		}
		return r.Data.Result, nil
	}

	// Both targets scraped once before the traffic, so that rates see it.
	var up []promSample
	pollFor(t, "both targets up", func() bool {
		up, _ = query("up == 1")
		return len(up) == 2
	}, func() string { return fmt.Sprintf("up: %v\nprometheus: %s", up, promLog.String()) })
	sendTraffic(t, serveAddr, envoyHTTP)

	// Every expression returning series.
	deadline := time.Now().Add(2 * time.Minute)
	pending := exprs
	for len(pending) > 0 {
		next := map[string]string{}
		var last []string
		for name, q := range pending {
			res, err := query(q)
			if err != nil || len(res) == 0 {
				next[name] = q
				last = append(last, fmt.Sprintf("%s: %s: %d series, %v", name, q, len(res), err))
			}
		}
		pending = next
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			up, _ := query("up")
			t.Fatalf("no series after 2 minutes for:\n%s\nup: %v\nprometheus: %s", strings.Join(last, "\n"), up, promLog.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	// The traffic shows: policy free and rule edge refused some.
	for q, label := range map[string]string{
		exprs[`panel "HTTP refusal ratio, by policy" A`]:   "free",
		exprs[`panel "Envoy over-limit ratio, by rule" A`]: "edge",
		exprs[`panel "Key cap overflows per second" A`]:    "rls",
	} {
		var res []promSample
		pollFor(t, q, func() bool {
			var err error
			res, err = query(q)
			if err != nil {
				return false
			}
			for _, s := range res {
				if v, _ := strconv.ParseFloat(s.Value[1].(string), 64); v > 0 && strings.Contains(fmt.Sprint(s.Metric), label) {
					return true
				}
			}
			return false
		}, func() string { return fmt.Sprintf("want a value above 0 for %s; got %v", label, res) })
	}
	// Prometheus evaluates every rule of the file without error.
	pollFor(t, "every rule evaluated", func() bool {
		resp, err := hc.Get("http://" + promAddr + "/api/v1/rules")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var r struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&r) != nil {
			return false
		}
		n := 0
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				if rule.Health == "err" {
					t.Fatalf("rule %s: %s", rule.Name, rule.LastError)
				}
				if rule.Health == "ok" {
					n++
				}
			}
		}
		return n == 7
	}, func() string { return "" })

	// A reload after a file change (a comment) keeps the envoy service's
	// counters: the same traffic again doubles them (counters zeroed by
	// the reload would read 8 here, not 16).
	scrape := func(series string) string {
		resp, err := hc.Get("http://" + envoyHTTP + "/metrics")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				return v
			}
		}
		return "absent"
	}
	const requests = `slidegate_rls_requests_total{descriptor="remote_address",domain="edge"}`
	if v := scrape(requests); v != "8" {
		t.Fatalf("%s %s before the reload, want 8", requests, v)
	}
	writeFileT(t, filepath.Join(rt, "edge.yaml"), readFile(t, filepath.Join(rt, "edge.yaml"))+"# a comment\n")
	const reloaded = `slidegate_config_reloads_total{result="success",surface="rls"}`
	pollFor(t, "the reload", func() bool { return scrape(reloaded) == "1" },
		func() string { return reloaded + " " + scrape(reloaded) + "\n" + envoyLog.String() })
	sendEnvoy(t, envoyHTTP)
	if v := scrape(requests); v != "16" {
		t.Errorf("%s %s after a reload and the same traffic again, want 16", requests, v)
	}
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// sendTraffic makes decisions on both servers: policy free and rule edge
// refuse some, the envoy service's key cap turns a third key away, and
// one request is malformed.
func sendTraffic(t *testing.T, serveAddr, envoyHTTP string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	for i := range 8 {
		body := fmt.Sprintf(`{"policy": "free", "key": "k%d"}`, i%2)
		if i == 7 {
			body = `{"policy": "paid", "key": "k"}`
		}
		resp, err := c.Post("http://"+serveAddr+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := c.Post("http://"+serveAddr+"/v1/allow", "application/json", strings.NewReader(`{"policy": 5`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sendEnvoy(t, envoyHTTP)
}

// sendEnvoy sends envoy serve 8 descriptors of rule edge over /json, on
// three client addresses.
func sendEnvoy(t *testing.T, envoyHTTP string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	for i := range 8 {
		body := fmt.Sprintf(`{"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.%d"}]}]}`, i%3)
		resp, err := c.Post("http://"+envoyHTTP+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("envoy serve /json: %d", resp.StatusCode)
		}
	}
}

// pollFor waits up to a minute for cond; last says what it saw.
func pollFor(t *testing.T, what string, cond func() bool, last func() string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute: %s", what, last())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func writeFileT(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
