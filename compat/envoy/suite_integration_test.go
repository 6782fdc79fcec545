package envoy

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// test/integration/integration_test.go: the peer's integration tests on
// its own runtime tree (test/integration/runtime/current) and its own
// Redis set-ups, each started here as real redis-server processes on
// loopback: a plain server, one with a password (REDIS_AUTH), one on TLS
// with a password (REDIS_TLS, certificates made by the test), one that
// also asks for a client certificate, a 3-master Cluster with a password,
// and a Sentinel in front of a master with a password. The variants that
// add a per-second Redis use the same set-up for it.

const integPassword = "password123"

// redisSetup is one of the peer's Redis deployments.
type redisSetup struct {
	vars    map[string]string // the services' REDIS_* variables
	masters []string          // emptied between two services' runs
	tls     *tls.Config       // the client's TLS to the masters; nil: plain
	pass    string
}

// flush empties every master.
func (s *redisSetup) flush(t *testing.T) {
	t.Helper()
	for _, a := range s.masters {
		rdb := redis.NewClient(&redis.Options{Addr: a, Password: s.pass, TLSConfig: s.tls})
		err := rdb.FlushAll(context.Background()).Err()
		_ = rdb.Close()
		if err != nil {
			t.Fatalf("FLUSHALL on %s: %v", a, err)
		}
	}
}

// redisProcs starts the test's redis-server processes and stops them at
// its end.
type redisProcs struct {
	t   *testing.T
	dir string
}

// common are the flags of every server but the Sentinel.
func (r *redisProcs) common(port int) []string {
	return []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no", "--dir", r.dir}
}

// start runs redis-server with args on a free port (and its cluster bus
// port, port+10000, free too) and waits until it answers PING with pass
// and tc. It returns the address.
func (r *redisProcs) start(pass string, tc *tls.Config, args func(port int) []string) string {
	t := r.t
	t.Helper()
	for range 20 {
		port := freePort(t)
		if port+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err != nil {
			continue
		} else {
			_ = l.Close()
		}
		cmd := exec.Command("redis-server", args(port)...)
		out := &lockedBuf{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if r.ready(addr, pass, tc, done) {
			return addr
		}
		t.Logf("redis-server on %s did not start: %s", addr, lastLine(out.String()))
	}
	t.Fatal("could not start redis-server")
	return ""
}

// ready waits (30 s at most) until addr answers PING.
func (r *redisProcs) ready(addr, pass string, tc *tls.Config, done chan struct{}) bool {
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: pass, TLSConfig: tc})
	defer rdb.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return false
		default:
		}
		if rdb.Ping(context.Background()).Err() == nil {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// startSetups starts every Redis set-up of the peer's integration tests.
func startSetups(t *testing.T, e env) map[string]*redisSetup {
	t.Helper()
	rp := &redisProcs{t: t, dir: t.TempDir()}
	out := map[string]*redisSetup{}
	out["plain"] = &redisSetup{vars: map[string]string{"REDIS_URL": e.redis}, masters: []string{e.redis}}
	auth := rp.start(integPassword, nil, func(p int) []string {
		return append(rp.common(p), "--requirepass", integPassword)
	})
	out["auth"] = &redisSetup{vars: map[string]string{"REDIS_URL": auth, "REDIS_AUTH": integPassword}, masters: []string{auth}, pass: integPassword}

	// TLS with a password, and TLS asking for a client certificate.
	certs := t.TempDir()
	ca := tlstest.NewCA(t, "redis CA")
	caFile := ca.WriteCA(t, certs, "ca")
	srvCert, srvKey := ca.WriteServer(t, certs, "redis", "redis")
	cliCert, cliKey := ca.WriteClient(t, certs, "client", "ratelimit")
	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	tlsArgs := func(clients string) func(int) []string {
		return func(p int) []string {
			return append(rp.common(p), "--port", "0", "--tls-port", strconv.Itoa(p), "--tls-cert-file", srvCert, "--tls-key-file", srvKey,
				"--tls-ca-cert-file", caFile, "--tls-auth-clients", clients, "--requirepass", integPassword)
		}
	}
	plainTLS := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	a := rp.start(integPassword, plainTLS, tlsArgs("no"))
	out["tls"] = &redisSetup{vars: map[string]string{"REDIS_URL": a, "REDIS_AUTH": integPassword, "REDIS_TLS": "true", "REDIS_TLS_CACERT": caFile},
		masters: []string{a}, tls: plainTLS, pass: integPassword}
	clientTLS := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	a = rp.start(integPassword, clientTLS, tlsArgs("yes"))
	out["tls-client-cert"] = &redisSetup{vars: map[string]string{"REDIS_URL": a, "REDIS_AUTH": integPassword, "REDIS_TLS": "true",
		"REDIS_TLS_CACERT": caFile, "REDIS_TLS_CLIENT_CERT": cliCert, "REDIS_TLS_CLIENT_KEY": cliKey},
		masters: []string{a}, tls: clientTLS, pass: integPassword}

	// Three masters, no replicas, with a password.
	var nodes []string
	for range 3 {
		nodes = append(nodes, rp.start(integPassword, nil, func(p int) []string {
			return append(rp.common(p), "--requirepass", integPassword, "--masterauth", integPassword,
				"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(rp.dir, "nodes-"+strconv.Itoa(p)+".conf"),
				"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no")
		}))
	}
	create := exec.Command("redis-cli", append(append([]string{"-a", integPassword, "--no-auth-warning", "--cluster", "create"}, nodes...),
		"--cluster-replicas", "0", "--cluster-yes")...)
	if b, err := create.CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, b)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range nodes {
		rdb := redis.NewClient(&redis.Options{Addr: n, Password: integPassword})
		for {
			info, _ := rdb.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = rdb.Close()
				t.Fatalf("the cluster did not become ready within 60 s: %s", info)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = rdb.Close()
	}
	out["cluster"] = &redisSetup{vars: map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": strings.Join(nodes, ","), "REDIS_AUTH": integPassword,
		"REDIS_PIPELINE_WINDOW": "150us"}, masters: nodes, pass: integPassword}

	// A master with a password behind one Sentinel (the peer's
	// sentinel.conf, with a quorum of 1).
	master := rp.start(integPassword, nil, func(p int) []string {
		return append(rp.common(p), "--requirepass", integPassword)
	})
	mhost, mport, _ := net.SplitHostPort(master)
	sentinel := rp.start("", nil, func(p int) []string {
		conf := filepath.Join(rp.dir, "sentinel-"+strconv.Itoa(p)+".conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster %s %s 1\nsentinel auth-pass mymaster %s\nsentinel down-after-milliseconds mymaster 3000\n",
			p, rp.dir, mhost, mport, integPassword)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{conf, "--sentinel"}
	})
	out["sentinel"] = &redisSetup{vars: map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster," + sentinel, "REDIS_AUTH": integPassword},
		masters: []string{master}, pass: integPassword}
	return out
}

// ist is one expected status as the peer's test builds it
// (newDescriptorStatus): a limit with its remaining and a reset, or
// (noLimit) OK with neither.
type ist struct {
	code    rlsv3.RateLimitResponse_Code
	rpu     uint32
	unit    rlsv3.RateLimitResponse_RateLimit_Unit
	rem     uint32
	noLimit bool
}

// unitLen is the length of a unit's window.
var unitLen = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{perSecond: time.Second, perMinute: time.Minute, perHour: time.Hour, perDay: 24 * time.Hour}

// integ sends r and checks the answer as the peer's AssertProtoEqual
// does. The reset: the peer's test copies the whole seconds of the
// answer's own, so the peer's must be whole seconds; slidegate's is
// exact (docs/envoy.md, "Exact reset durations"): more than 0 and at
// most the limit's window.
func (c *chk) integ(r *rlsv3.RateLimitRequest, overall rlsv3.RateLimitResponse_Code, want ...ist) *rlsv3.RateLimitResponse {
	resp := c.call(r)
	if resp == nil {
		return nil
	}
	where := reqString(r)
	if resp.OverallCode != overall {
		c.errorf("%s: overall %v, want %v", where, resp.OverallCode, overall)
	}
	if len(resp.Statuses) != len(want) {
		c.errorf("%s: %d statuses, want %d", where, len(resp.Statuses), len(want))
		return resp
	}
	for i, w := range want {
		g := resp.Statuses[i]
		if g.Code != w.code || g.LimitRemaining != w.rem {
			c.errorf("%s: status %d %v remaining %d, want %v remaining %d", where, i, g.Code, g.LimitRemaining, w.code, w.rem)
		}
		if w.noLimit {
			if g.CurrentLimit != nil || g.DurationUntilReset != nil {
				c.errorf("%s: status %d limit %v reset %v, want neither", where, i, g.CurrentLimit, g.DurationUntilReset)
			}
			continue
		}
		if l := g.CurrentLimit; l == nil || l.RequestsPerUnit != w.rpu || l.Unit != w.unit || l.Name != "" || l.UnitMultiplier != nil {
			c.errorf("%s: status %d limit %v, want %d/%v", where, i, g.CurrentLimit, w.rpu, w.unit)
		}
		d := g.DurationUntilReset
		switch {
		case d == nil:
			c.errorf("%s: status %d has no reset", where, i)
		case c.p.who == whoPeer && d.Nanos != 0:
			c.errorf("%s: status %d reset %v, want whole seconds", where, i, d.AsDuration())
		case c.p.who == whoSG && (d.AsDuration() <= 0 || d.AsDuration() > unitLen[w.unit]):
			c.errorf("%s: status %d reset %v, want within (0, %v]", where, i, d.AsDuration(), unitLen[w.unit])
		}
	}
	return resp
}

// integBasic is testBasicBaseConfig without its statistics (not
// observable over the ports). local: the variant's keys end in _local.
// stopIncrement: the peer's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
// which makes the peer's answers slidegate's all or nothing: slidegate
// checks them always (docs/envoy.md, "All or nothing").
func integBasic(c *chk, local, stopIncrement bool) {
	k := func(key string) string {
		if local {
			return key + "_local"
		}
		return key
	}
	allOrNothing := stopIncrement || c.p.who == whoSG
	c.integ(req("foo", []string{k("hello"), "world"}), codeOK, ist{code: codeOK, noLimit: true})
	c.integ(req("basic", []string{k("key1"), "foo"}), codeOK, ist{codeOK, 50, perSecond, 49, false})
	// The two loops below run within one clock minute, as the peer's
	// fixed minute window needs (10 s for 40 calls on a loaded machine).
	if sec := time.Now().Unix() % 60; sec >= 50 {
		time.Sleep(time.Duration(61-sec) * time.Second)
	}
	v := strconv.Itoa(rand.Int())
	for i := range 25 {
		code, rem := codeOK, uint32(20-(i+1))
		if i >= 20 {
			code, rem = codeOver, 0
		}
		c.integ(req("another", []string{k("key2"), v}), code, ist{code, 20, perMinute, rem, false})
	}
	v = strconv.Itoa(rand.Int())
	for i := range 15 {
		code, rem1, rem2 := codeOK, uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, rem2 = codeOver, 0
			if allOrNothing {
				rem1 = 10
			}
		}
		c.integ(req("another", []string{k("key2"), v}, []string{k("key3"), v}), code,
			ist{codeOK, 20, perMinute, rem1, false}, ist{code, 10, perHour, rem2, false})
	}
	r1 := c.call(req("another", []string{k("key4"), "durTest"}))
	time.Sleep(2 * time.Second)
	r2 := c.call(req("another", []string{k("key4"), "durTest"}))
	if r1 == nil || r2 == nil || len(r1.Statuses) != 1 || len(r2.Statuses) != 1 {
		return
	}
	if s1, s2 := r1.Statuses[0].DurationUntilReset.GetSeconds(), r2.Statuses[0].DurationUntilReset.GetSeconds(); s2 >= s1 {
		c.errorf("key4 reset: %d s, then %d s two seconds later; want less", s1, s2)
	}
}

// integReload is testConfigReload: reload.yaml copied into the watched
// directory is loaded, and its removal unloads it (the peer's test waits
// for its load counter; here the probe is the reload domain's block
// rule, limit 0).
func integReload(reloadYAML string) func(c *chk) {
	return func(c *chk) {
		block := req("reload", []string{"block", "foo"})
		c.integ(block, codeOK, ist{code: codeOK, noLimit: true})
		p := filepath.Join(c.dir, "reload.yaml")
		if err := os.WriteFile(p, []byte(reloadYAML), 0o644); err != nil {
			c.errorf("%v", err)
			return
		}
		probe := func() string {
			r := c.call(block)
			if r == nil {
				return "error"
			}
			return r.OverallCode.String()
		}
		c.eventually("reload/block once reload.yaml is copied in", "OVER_LIMIT", probe)
		c.integ(req("reload", []string{"key1", "foo"}), codeOK, ist{codeOK, 50, perSecond, 49, false})
		if err := os.Remove(p); err != nil {
			c.errorf("%v", err)
			return
		}
		c.eventually("reload/block once reload.yaml is removed", "OK", probe)
	}
}

// integShare is testShareThreshold.
func integShare(c *chk) {
	const d = "share-threshold-test"
	for range 10 {
		c.call(req(d, []string{"files", "files/a.pdf"}))
	}
	c.integ(req(d, []string{"files", "files/b.csv"}), codeOver, ist{codeOver, 10, perHour, 0, false})
	base := time.Now().UnixNano()
	for range 10 {
		c.integ(req(d, []string{"files_no_share", fmt.Sprintf("files_no_share/%d-%d", base, rand.Int64())}), codeOK, ist{codeOK, 10, perHour, 9, false})
	}
}

const (
	rowExactReset   = "Exact reset durations."
	rowAllOrNothing = "All or nothing."
	rowRefusedVar   = "A feature slidegate does not have stops the start."
)

func TestPeerSuiteIntegration(t *testing.T) {
	e := needEnv(t)
	rt := filepath.Join(e.src, "test", "integration", "runtime", "current", "ratelimit")
	files := map[string]string{}
	for _, f := range []string{"another.yaml", "basic.yaml", "share_threshold.yaml"} {
		b, err := os.ReadFile(filepath.Join(rt, "config", f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	reloadYAML, err := os.ReadFile(filepath.Join(rt, "reload.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	setups := startSetups(t, e)
	// env is a set-up's variables with a variant's.
	// REDIS_TIMEOUT is the peer's default, given to both. slidegate's
	// own is 50 ms. A slower call to a Redis that still answers is
	// refused (docs/distributed.md), which a loaded machine can cause.
	env := func(s *redisSetup, perSecond bool, localCache int, extra map[string]string) map[string]string {
		m := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TIMEOUT": "10s"}
		for k, v := range s.vars {
			m[k] = v
		}
		if perSecond {
			m["REDIS_PERSECOND"] = "true"
			m["REDIS_PERSECOND_SOCKET_TYPE"] = "tcp"
			for _, k := range []string{"TYPE", "URL", "AUTH", "TLS", "PIPELINE_WINDOW"} {
				if v, ok := s.vars["REDIS_"+k]; ok {
					m["REDIS_PERSECOND_"+k] = v
				}
			}
		}
		if localCache > 0 {
			m["LOCAL_CACHE_SIZE_IN_BYTES"] = strconv.Itoa(localCache)
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	// basic is one variant of testBasicBaseConfig on setup s.
	basic := func(name string, s *redisSetup, perSecond bool, localCache int, extra map[string]string) suiteCase {
		vars := env(s, perSecond, localCache, extra)
		stop := extra["STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"] == "true"
		sc := suiteCase{name: name, files: files, store: func(t *testing.T) map[string]string { s.flush(t); return vars },
			check: func(c *chk) { integBasic(c, localCache > 0, stop) }}
		switch {
		case perSecond || localCache > 0:
			// The per-second Redis and the local over-limit cache are
			// refused at start, naming the variable.
			sc.differs = []string{rowRefusedVar}
			sc.sgCheck = func(c *chk, up bool) {
				c.exited(up, 2, regexp.MustCompile(`(REDIS_PERSECOND|LOCAL_CACHE_SIZE_IN_BYTES)="(true|`+strconv.Itoa(localCache)+`)": `))
			}
		case stop:
			sc.differs = []string{rowExactReset}
		default:
			sc.differs = []string{rowExactReset, rowAllOrNothing}
		}
		return sc
	}
	stopInc := map[string]string{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"}
	plain := setups["plain"]
	cases := []suiteCase{
		basic("TestBasicConfig/WithoutPerSecondRedis", plain, false, 0, nil),
		basic("TestBasicConfig/WithPerSecondRedis", plain, true, 0, nil),
		basic("TestBasicConfig/WithoutPerSecondRedisWithLocalCache", plain, false, 1000, nil),
		basic("TestBasicConfig/WithPerSecondRedisWithLocalCache", plain, true, 1000, nil),
		basic("TestBasicConfig/WithoutPerSecondRedisWithCachePrefix", plain, false, 0, map[string]string{"CACHE_KEY_PREFIX": "prefix:"}),
		basic("TestBasicConfig/WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", plain, false, 0, stopInc),
		basic("TestBasicConfig/WithPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", plain, true, 0, stopInc),
		basic("TestBasicConfig/WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig", plain, false, 1000, stopInc),
		basic("TestBasicConfig/WithPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig", plain, true, 1000, stopInc),
	}
	for _, v := range []struct {
		test, sub, setup string
	}{
		{"TestBasicTLSConfig", "RedisTLS", "tls"},
		{"TestBasicAuthConfig", "RedisAuth", "auth"},
		{"TestBasicAuthConfigWithRedisCluster", "RedisAuth", "cluster"},
		{"TestBasicAuthConfigWithRedisSentinel", "RedisAuth", "sentinel"},
	} {
		s := setups[v.setup]
		cases = append(cases,
			basic(v.test+"/WithoutPerSecond"+v.sub, s, false, 0, nil),
			basic(v.test+"/WithPerSecond"+v.sub, s, true, 0, nil),
			basic(v.test+"/WithoutPerSecond"+v.sub+"WithLocalCache", s, false, 1000, nil),
			basic(v.test+"/WithPerSecond"+v.sub+"WithLocalCache", s, true, 1000, nil))
		if v.setup == "tls" {
			cases = append(cases, basic(v.test+"/WithoutPerSecondRedisTLSWithClientCert", setups["tls-client-cert"], false, 0, nil))
		}
	}
	plainVars := env(plain, false, 0, map[string]string{"RUNTIME_WATCH_ROOT": "false"})
	flushPlain := func(t *testing.T) map[string]string { plain.flush(t); return plainVars }
	cases = append(cases,
		basic("TestBasicReloadConfig/BasicWithoutWatchRoot", plain, false, 0, map[string]string{"RUNTIME_WATCH_ROOT": "false"}),
		suiteCase{name: "TestBasicReloadConfig/ReloadWithoutWatchRoot", files: files, store: flushPlain, check: integReload(string(reloadYAML)),
			differs: []string{rowExactReset}},
		suiteCase{name: "TestShareThreshold/WithoutPerSecondRedis", files: files, store: flushPlain, check: integShare,
			differs: []string{rowExactReset}},
	)
	cases = append(cases, grpcTLSCases(t, setups["tls"], e.redis)...)
	cases = append(cases, extraTagsCase(t, files))
	cases = append(cases, memcacheCases(t, files, e.redis)...)
	cases = append(cases, xdsCases(t)...)
	// Each set-up's cases run one after the other, the set-ups at once.
	group := map[string]string{"TestBasicTLSConfig": "tls", "TestBasicAuthConfig": "auth", "TestBasicAuthConfigWithRedisCluster": "cluster",
		"TestBasicAuthConfigWithRedisSentinel": "sentinel", "Test_mTLS": "grpc-tls", "TestReloadGRPCServerCerts": "grpc-tls", "TestBasicConfig_ExtraTags": "statsd",
		"TestBasicConfigMemcache": "memcache", "TestConfigMemcacheWithMaxIdleConns": "memcache", "TestMultiNodeMemcache": "memcache",
		"TestXdsProviderBasicConfig": "xds", "TestXdsProviderBasicConfigReload": "xds"}
	for i := range cases {
		test, _, _ := strings.Cut(cases[i].name, "/")
		cases[i].group = cmpOr(group[test], "plain")
	}
	runSuite(t, "test/integration", cases,
		"Test_mTLSSetup (it tests the peer test's own certificate helper, mTLSSetup, not the service)")
}

// tlsUp waits until a TLS handshake with cfg succeeds on the service's
// gRPC port: true, or false when it exited first (90 s at most).
func tlsUp(cfg *tls.Config) func(c *chk) bool {
	return func(c *chk) bool {
		deadline := time.Now().Add(90 * time.Second)
		for {
			if c.tlsDial(cfg) == nil {
				return true
			}
			select {
			case <-c.p.exited:
				return false
			default:
			}
			if time.Now().After(deadline) {
				c.errorf("no TLS handshake within 90 s")
				return false
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// tlsDial makes one TLS handshake with the service's gRPC port.
func (c *chk) tlsDial(cfg *tls.Config) error {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", c.p.grpcAddr)
	if err == nil {
		_ = conn.Close()
	}
	return err
}

// grpcTLSCases are Test_mTLS and TestReloadGRPCServerCerts: the gRPC
// server's TLS, with the peer's variables.
func grpcTLSCases(t *testing.T, redisTLS *redisSetup, redisAddr string) []suiteCase {
	dir := t.TempDir()
	serverCA, clientCA := tlstest.NewCA(t, "server CA"), tlstest.NewCA(t, "client CA")
	cert, key := serverCA.WriteServer(t, dir, "server", "ratelimit")
	mtls := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": cert, "GRPC_SERVER_TLS_KEY": key,
		"GRPC_CLIENT_TLS_CACERT": clientCA.WriteCA(t, dir, "client-ca"), "GRPC_CLIENT_TLS_SAN": "localhost"}
	for k, v := range redisTLS.vars {
		mtls[k] = v
	}
	client := &tls.Config{RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{clientCA.ClientFor(t, "client", "localhost")}, MinVersion: tls.VersionTLS12}

	// Two server certificates of two CAs: the service starts on the
	// first, and the second is renamed over it.
	rot := t.TempDir()
	initialCA, newCA := tlstest.NewCA(t, "initial CA"), tlstest.NewCA(t, "new CA")
	read := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ic, ik := initialCA.WriteServer(t, dir, "initial", "ratelimit")
	nc, nk := newCA.WriteServer(t, dir, "new", "ratelimit")
	initial, next := [2][]byte{read(ic), read(ik)}, [2][]byte{read(nc), read(nk)}
	live := [2]string{filepath.Join(rot, "server.pem"), filepath.Join(rot, "server-key.pem")}
	initialCfg := &tls.Config{RootCAs: initialCA.Pool(), MinVersion: tls.VersionTLS12}
	newCfg := &tls.Config{RootCAs: newCA.Pool(), MinVersion: tls.VersionTLS12}
	write := func(t *testing.T, pair [2][]byte, suffix string) {
		for i, f := range live {
			if err := os.WriteFile(f+suffix, pair[i], 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return []suiteCase{
		// The peer's test dials (lazily) and asserts no error: here a TLS
		// handshake with a client certificate of the client CA naming
		// the SAN completes, with Redis on TLS with a password.
		{name: "Test_mTLS", env: mtls, up: tlsUp(client), check: func(c *chk) {
			if err := c.tlsDial(client); err != nil {
				c.errorf("TLS handshake with a client certificate naming localhost: %v", err)
			}
		}},
		// REDIS_URL given: the peer's launch then leaves the shared
		// server's keys alone (no request is made).
		{name: "TestReloadGRPCServerCerts", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": live[0], "GRPC_SERVER_TLS_KEY": live[1],
			"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr},
			before: func(t *testing.T) { write(t, initial, "") }, up: tlsUp(initialCfg), check: func(c *chk) {
				if err := c.tlsDial(initialCfg); err != nil {
					c.errorf("WithInitialCert: %v", err)
				}
				if c.tlsDial(newCfg) == nil {
					c.errorf("WithNewCertFail: a client of the new CA completed a handshake before the rotation")
				}
				write(t, next, ".new")
				for _, f := range live {
					if err := os.Rename(f+".new", f); err != nil {
						c.errorf("%v", err)
					}
				}
				c.eventually("WithNewCertOK: a handshake trusting the new CA", "ok", func() string {
					if err := c.tlsDial(newCfg); err != nil {
						return err.Error()
					}
					return "ok"
				})
				if c.tlsDial(initialCfg) == nil {
					c.errorf("WithInitialCertFail: a client of the initial CA completed a handshake after the rotation")
				}
			}},
	}
}
