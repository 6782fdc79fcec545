package envoy

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// The peer's own test suites (test/config, test/service, test/server at
// the pinned version), translated to requests against two running
// processes: the peer's service_cmd and slidegate envoy serve, each
// started on the same runtime tree with the same variables.

var (
	sgBinOnce sync.Once
	sgBinPath string
	sgBinErr  error
	sgBinDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sgBinDir != "" {
		_ = os.RemoveAll(sgBinDir)
	}
	os.Exit(code)
}

// slidegateBin builds cmd/slidegate once per run ($SLIDEGATE_BIN names a
// built binary instead).
func slidegateBin(t *testing.T) string {
	t.Helper()
	sgBinOnce.Do(func() {
		if p := os.Getenv("SLIDEGATE_BIN"); p != "" {
			sgBinPath = p
			return
		}
		sgBinDir, sgBinErr = os.MkdirTemp("", "slidegate-peersuite-")
		if sgBinErr != nil {
			return
		}
		sgBinPath = filepath.Join(sgBinDir, "slidegate")
		goCmd := os.Getenv("GO") // as make test-envoy passes it
		if goCmd == "" {
			goCmd = "go"
		}
		out, err := exec.Command(goCmd, "build", "-o", sgBinPath, "github.com/slidegate/slidegate/cmd/slidegate").CombinedOutput()
		if err != nil {
			sgBinErr = fmt.Errorf("building slidegate: %v: %s", err, out)
		}
	})
	if sgBinErr != nil {
		t.Fatal(sgBinErr)
	}
	return sgBinPath
}

// lockedBuf is a process's output, written by exec's copier and read by
// the test.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// proc is one running service: the peer or slidegate.
type proc struct {
	who      string
	cmd      *exec.Cmd
	out      *lockedBuf
	exited   chan struct{}
	httpBase string
	grpcAddr string
	rl       rlsv3.RateLimitServiceClient
	health   healthpb.HealthClient
}

const (
	whoPeer = "peer"
	whoSG   = "slidegate"
)

// launch starts the peer or slidegate on the runtime tree at root. The
// peer gets its own flushed Redis; slidegate runs on its memory store.
func launch(t *testing.T, e env, who, root string, extra map[string]string) *proc {
	t.Helper()
	grpcPort, httpPort := freePort(t), freePort(t)
	vars := []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "LOG_LEVEL=warn", "HOST=127.0.0.1", "GRPC_HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(httpPort), "GRPC_PORT=" + strconv.Itoa(grpcPort)}
	var cmd *exec.Cmd
	if who == whoPeer {
		// A case that names its own Redis empties it itself.
		if extra["REDIS_URL"] == "" {
			rdb := redis.NewClient(&redis.Options{Addr: e.redis})
			err := rdb.FlushAll(context.Background()).Err()
			_ = rdb.Close()
			if err != nil {
				t.Fatalf("flushing the peer's Redis: %v", err)
			}
		}
		cmd = exec.Command(filepath.Join(e.bin, "service_cmd"))
		vars = append(vars, "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+e.redis, "DEBUG_HOST=127.0.0.1",
			"DEBUG_PORT="+strconv.Itoa(freePort(t)), "EXPIRATION_JITTER_MAX_SECONDS=0", "DISABLE_STATS=true")
	} else {
		cmd = exec.Command(slidegateBin(t), "envoy", "serve")
	}
	cmd.Env = append(os.Environ(), vars...)
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{who: who, cmd: cmd, out: &lockedBuf{}, exited: make(chan struct{}), httpBase: fmt.Sprintf("http://127.0.0.1:%d", httpPort),
		grpcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.rl, p.health = rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	t.Cleanup(func() {
		_ = conn.Close()
		_ = cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// up waits until the service answers a rate limit request (an answer or a
// service error, not Unavailable): true, or false when it exited first.
func (p *proc) up(t *testing.T) bool {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := p.rl.ShouldRateLimit(ctx, req("slidegate-probe", []string{"k", "v"}))
		cancel()
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			return true
		}
		select {
		case <-p.exited:
			return false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s neither answered nor exited within 90 s: %v\n%s", p.who, err, p.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// req is a request of one descriptor per kv list.
func req(domain string, descs ...[]string) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: domain}
	for _, kv := range descs {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r
}

// chk collects what a service answered against the test's expectation,
// so that the driver can tell the peer's failures from slidegate's.
type chk struct {
	p     *proc
	dir   string       // the configuration directory
	redis *redisServer // with ownRedis
	errs  []string
	// settle, when set, runs after each answered call (the memcache
	// cases wait there for the peer's asynchronous increments).
	settle func(r *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse)
}

func (c *chk) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

func (c *chk) call(r *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.p.rl.ShouldRateLimit(ctx, r)
	if err != nil {
		c.errorf("%s: %v", reqString(r), err)
		return nil
	}
	if c.settle != nil {
		c.settle(r, resp)
	}
	return resp
}

func reqString(r *rlsv3.RateLimitRequest) string {
	var b strings.Builder
	b.WriteString(r.Domain)
	for _, d := range r.Descriptors {
		b.WriteString(" [")
		for i, e := range d.Entries {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(e.Key + "=" + e.Value)
		}
		if d.Limit != nil {
			fmt.Fprintf(&b, " limit=%d/%v", d.Limit.RequestsPerUnit, d.Limit.Unit)
		}
		b.WriteString("]")
	}
	return b.String()
}

// lim is an expected current limit; nil means the descriptor has none.
type lim struct {
	rpu  uint32
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	name string
}

var (
	perSecond = rlsv3.RateLimitResponse_RateLimit_SECOND
	perMinute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	perHour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	perDay    = rlsv3.RateLimitResponse_RateLimit_DAY
)

// limit sends one request of one descriptor and checks the limit the
// service found for it (GetLimit in the peer's test): nil is an OK status
// without a current limit.
func (c *chk) limit(r *rlsv3.RateLimitRequest, want *lim) *rlsv3.RateLimitResponse_DescriptorStatus {
	resp := c.call(r)
	if resp == nil {
		return nil
	}
	if len(resp.Statuses) != len(r.Descriptors) {
		c.errorf("%s: %d statuses", reqString(r), len(resp.Statuses))
		return nil
	}
	st := resp.Statuses[0]
	got := st.CurrentLimit
	switch {
	case want == nil && got != nil:
		c.errorf("%s: want no limit, got %v", reqString(r), got)
	case want == nil && st.Code != rlsv3.RateLimitResponse_OK:
		c.errorf("%s: want OK without a limit, got %v", reqString(r), st.Code)
	case want != nil && got == nil:
		c.errorf("%s: want %d/%v, got no limit", reqString(r), want.rpu, want.unit)
	case want != nil && (got.RequestsPerUnit != want.rpu || got.Unit != want.unit || got.Name != want.name):
		c.errorf("%s: want %d/%v name %q, got %d/%v name %q", reqString(r), want.rpu, want.unit, want.name, got.RequestsPerUnit, got.Unit, got.Name)
	}
	return st
}

// suiteCase is one of the peer's tests, translated.
type suiteCase struct {
	name  string            // the peer's test (and subtest)
	files map[string]string // the runtime tree's config directory
	env   map[string]string // both services' extra variables
	// refused, when set: the configuration is refused; the peer logs the
	// test's exact message and answers no request; slidegate exits with a
	// message matching sg (the file and the same fault).
	refused *refusal
	check   func(c *chk)
	// minute: start early in a clock minute, so that the peer's fixed
	// minute window does not roll over during the checks.
	minute bool
	// store, when set, empties the case's Redis set-up and returns its
	// variables, which override env; the two services then run at once.
	store func(t *testing.T) map[string]string
	// group: cases of different groups run at once (each group on its
	// own Redis set-up); "" is a group too.
	group string
	// before, when set, runs before each service starts (the cases run
	// one service after the other).
	before func(t *testing.T)
	// up, when set, waits until the service is up instead of a rate
	// limit request over plaintext gRPC: true, or false when it exited.
	up func(c *chk) bool
	// ownRedis: the service gets a Redis server of its own (REDIS_URL),
	// which the check may stop and start again (chk.redis).
	ownRedis bool
	// differs, when set, names the rows of docs/envoy.md's table of
	// differences this test meets: check is the peer's test, sgCheck
	// checks exactly what slidegate does instead (up: whether it
	// answered; false when it exited). Without sgCheck, check is run on
	// slidegate too and checks slidegate's side itself (chk.who).
	differs []string
	sgCheck func(c *chk, up bool)
	// finding: slidegate is known to fail this test, for the reason
	// given; its half is skipped with what it answered. Every other case
	// fails the run when slidegate fails it.
	finding string
}

type refusal struct {
	peer []string // the log has one of these
	sg   *regexp.Regexp
}

// suiteTally counts a suite's translated tests: one of the peer's tests
// (its subtests together) passes when every case of it passes.
type suiteTally struct {
	mu      sync.Mutex // groups of cases run at once
	order   []string
	outcome map[string]string // test → pass, documented or fail
}

func (s *suiteTally) add(caseName, outcome string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	test, _, _ := strings.Cut(caseName, "/")
	prev, seen := s.outcome[test]
	if !seen {
		s.order = append(s.order, test)
		s.outcome[test] = ""
	}
	rank := map[string]int{"": 0, "pass": 1, "documented": 2, "fail": 3}
	if rank[outcome] > rank[prev] {
		s.outcome[test] = outcome
	}
}

func (s *suiteTally) line(suite string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[string]int{}
	var failed []string
	for _, test := range s.order {
		n[s.outcome[test]]++
		if s.outcome[test] == "fail" {
			failed = append(failed, test)
		}
	}
	l := fmt.Sprintf("%s: %d tests: %d pass on both, %d differ as documented, %d fail", suite, len(s.order), n["pass"], n["documented"], n["fail"])
	if len(failed) > 0 {
		l += " (" + strings.Join(failed, ", ") + ")"
	}
	return l
}

// runSuite runs every case on the peer and on slidegate. The peer must
// pass every one (otherwise the translation asks more than its test).
// notApplicable names the suite's tests that test no part of the
// service (a helper of the peer's test), and why.
func runSuite(t *testing.T, suite string, cases []suiteCase, notApplicable ...string) {
	e := needEnv(t)
	slidegateBin(t)
	tl := &suiteTally{outcome: map[string]string{}}
	var groups []string
	byGroup := map[string][]suiteCase{}
	for _, sc := range cases {
		tl.add(sc.name, "") // the line lists the tests in this order
		if _, ok := byGroup[sc.group]; !ok {
			groups = append(groups, sc.group)
		}
		byGroup[sc.group] = append(byGroup[sc.group], sc)
	}
	if len(groups) == 1 {
		for _, sc := range cases {
			t.Run(sc.name, func(t *testing.T) { runCase(t, e, tl, sc) })
		}
	} else {
		// Groups run at once (each on its own Redis set-up), the cases of
		// a group one after the other.
		t.Run("groups", func(t *testing.T) {
			for _, g := range groups {
				t.Run(g, func(t *testing.T) {
					t.Parallel()
					for _, sc := range byGroup[g] {
						t.Run(sc.name, func(t *testing.T) { runCase(t, e, tl, sc) })
					}
				})
			}
		})
	}
	l := tl.line(suite)
	if len(notApplicable) > 0 {
		l += fmt.Sprintf("; %d not applicable: %s", len(notApplicable), strings.Join(notApplicable, ", "))
	}
	t.Log(l)
	fmt.Println(l)
}

// runCase runs one case on the peer and on slidegate and records its
// outcome.
func runCase(t *testing.T, e env, tl *suiteTally, sc suiteCase) {
	results := map[string][]string{}
	if sc.store == nil {
		for _, who := range []string{whoPeer, whoSG} {
			results[who] = runOne(t, e, who, sc, nil)
		}
	} else {
		// One Redis set-up, emptied once: the two services run at
		// once (their keys never meet: slidegate's hold a brace).
		vars := sc.store(t)
		var mu sync.Mutex
		t.Run("both", func(t *testing.T) {
			for _, who := range []string{whoPeer, whoSG} {
				t.Run(who, func(t *testing.T) {
					t.Parallel()
					errs := runOne(t, e, who, sc, vars)
					mu.Lock()
					defer mu.Unlock()
					results[who] = errs
				})
			}
		})
	}
	if errs := results[whoPeer]; len(errs) > 0 {
		tl.add(sc.name, "fail")
		t.Errorf("the peer fails the translated test (the translation is wrong):\n  %s", strings.Join(errs, "\n  "))
	}
	errs := results[whoSG]
	switch {
	case slices.ContainsFunc(sc.differs, func(row string) bool { return !strings.Contains(envoyDoc(t), "**"+row+"**") }):
		tl.add(sc.name, "fail")
		t.Errorf("docs/envoy.md's table of differences lacks one of the rows %q", sc.differs)
	case len(sc.differs) > 0 && len(errs) == 0:
		tl.add(sc.name, "documented")
	case len(sc.differs) > 0:
		tl.add(sc.name, "fail")
		t.Errorf("slidegate does not do what docs/envoy.md's rows %q say:\n  %s", sc.differs, strings.Join(errs, "\n  "))
	case len(errs) == 0:
		tl.add(sc.name, "pass")
	case sc.finding != "":
		tl.add(sc.name, "fail")
		t.Skipf("FINDING (%s): slidegate fails the peer's test, the peer passes it:\n  %s", sc.finding, strings.Join(errs, "\n  "))
	default:
		tl.add(sc.name, "fail")
		t.Errorf("slidegate fails the peer's test, the peer passes it:\n  %s", strings.Join(errs, "\n  "))
	}
}

// runOne starts one service on the case's runtime tree and checks it.
func runOne(t *testing.T, e env, who string, sc suiteCase, storeVars map[string]string) []string {
	t.Helper()
	root, dir := writeRuntime(t, sc.files)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	vars := sc.env
	var rs *redisServer
	if sc.ownRedis {
		rs = startRedis(t)
		vars = map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rs.addr}
		for k, v := range sc.env {
			vars[k] = v
		}
	}
	if storeVars != nil {
		all := map[string]string{}
		for k, v := range vars {
			all[k] = v
		}
		for k, v := range storeVars {
			all[k] = v
		}
		vars = all
	}
	if sc.before != nil {
		sc.before(t)
	}
	p := launch(t, e, who, root, vars)
	c := &chk{p: p, dir: dir, redis: rs}
	var isUp bool
	if sc.up != nil {
		isUp = sc.up(c)
	} else {
		isUp = p.up(t)
	}
	if who == whoSG && sc.sgCheck != nil {
		if isUp && sc.minute {
			waitMinuteStart()
		}
		sc.sgCheck(c, isUp)
		return c.withLog()
	}
	if sc.refused != nil {
		configRefused(c, isUp, sc.refused)
		return c.errs
	}
	if !isUp {
		return []string{fmt.Sprintf("%s exited: %s", who, lastLine(p.out.String()))}
	}
	if sc.minute {
		waitMinuteStart()
	}
	sc.check(c)
	return c.withLog()
}

// withLog is the check's errors, followed by the end of the service's
// output when there are any (what it logged about them).
func (c *chk) withLog() []string {
	if len(c.errs) == 0 {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(c.p.out.String()), "\n")
	return append(c.errs, "its output ends: "+strings.Join(lines[max(0, len(lines)-5):], "\n    "))
}

// waitMinuteStart waits, late in a clock minute, for the next one, so
// that the peer's fixed minute window does not roll over during a check.
func waitMinuteStart() {
	if sec := time.Now().Unix() % 60; sec >= 45 {
		time.Sleep(time.Duration(61-sec) * time.Second)
	}
}

// envoyDoc is docs/envoy.md's text.
func envoyDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// exited checks that slidegate exited with status code, its output
// matching msg.
func (c *chk) exited(up bool, code int, msg *regexp.Regexp) {
	if up {
		c.errorf("slidegate started; want exit status %d", code)
		return
	}
	<-c.p.exited
	if got := c.p.cmd.ProcessState.ExitCode(); got != code {
		c.errorf("slidegate exited %d, want %d: %s", got, code, lastLine(c.p.out.String()))
	}
	if out := c.p.out.String(); !msg.MatchString(out) {
		c.errorf("slidegate's message does not match %q: %s", msg, lastLine(out))
	}
}

// configRefused checks a refused configuration: the peer keeps running,
// logs the test's message and refuses every request ("no rate limit
// configuration loaded"); slidegate exits non-zero, naming the file and
// the fault.
func configRefused(c *chk, isUp bool, r *refusal) {
	p := c.p
	if p.who == whoPeer {
		if !isUp {
			c.errorf("the peer exited: %s", lastLine(p.out.String()))
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := p.rl.ShouldRateLimit(ctx, req("test-domain", []string{"key1", "value1"}))
		cancel()
		if err == nil || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
			c.errorf("a request: want the error \"no rate limit configuration loaded\", got %v", err)
		}
		if !slices.ContainsFunc(r.peer, func(m string) bool { return strings.Contains(p.out.String(), m) }) {
			c.errorf("the log has none of %q:\n%s", r.peer, p.out.String())
		}
		return
	}
	if isUp {
		c.errorf("slidegate started on a configuration the peer's test refuses")
		return
	}
	if code := p.cmd.ProcessState.ExitCode(); code == 0 {
		c.errorf("slidegate exited 0 on a refused configuration")
	}
	if out := p.out.String(); !r.sg.MatchString(out) {
		c.errorf("slidegate's message does not match %q: %s", r.sg, lastLine(out))
	}
}

// healthz is GET /healthcheck on the HTTP port: the status and the body.
func (c *chk) healthz() (int, string) {
	cl := &http.Client{Timeout: 30 * time.Second}
	resp, err := cl.Get(c.p.httpBase + "/healthcheck")
	if err != nil {
		c.errorf("GET /healthcheck: %v", err)
		return 0, ""
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// grpcHealth is grpc.health.v1 Check for service: the status, or the
// error's code.
func (c *chk) grpcHealth(service string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.p.health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return status.Code(err).String()
	}
	return r.Status.String()
}

// redisServer is a redis-server of one service's own, on a fixed port so
// that it can be stopped and started again at the same address.
type redisServer struct {
	addr string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	r := &redisServer{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	return r
}

// start runs redis-server and waits until it answers PING.
func (r *redisServer) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, port, _ := strings.Cut(r.addr, ":")
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.cmd, r.done = cmd, done
	rdb := redis.NewClient(&redis.Options{Addr: r.addr})
	defer rdb.Close()
	deadline := time.Now().Add(30 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer within 30 s", r.addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// stop kills redis-server and waits for it to exit.
func (r *redisServer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}
