package envoy

import (
	"bufio"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// statsdSink is a loopback listener that receives the peer's statsd
// lines. The peer's statsd sink (lyft/gostats' TCP sink) writes one
// "name:value|type" line per stat over TCP to STATSD_HOST:STATSD_PORT.
type statsdSink struct {
	addr  string
	mu    sync.Mutex
	lines []string
}

// startStatsd listens on a loopback port until the test ends.
func startStatsd(t *testing.T) *statsdSink {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &statsdSink{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var cmu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			conns = append(conns, conn)
			cmu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := bufio.NewScanner(conn)
				for sc.Scan() {
					s.mu.Lock()
					s.lines = append(s.lines, sc.Text())
					s.mu.Unlock()
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		cmu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		cmu.Unlock()
		wg.Wait()
	})
	return s
}

// sum adds the values of the counter lines whose name is exactly name.
func (s *statsdSink) sum(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.lines {
		stat, rest, ok := strings.Cut(l, ":")
		if !ok || stat != name {
			continue
		}
		v, typ, _ := strings.Cut(rest, "|")
		if typ != "c" {
			continue
		}
		if i, err := strconv.Atoi(v); err == nil {
			n += i
		}
	}
	return n
}

// extraTagsCase is TestBasicConfig_ExtraTags. The peer's test reads its
// in-process stats store; here the same counters arrive as statsd lines
// on a listener of the test's (USE_STATSD, STATSD_HOST, STATSD_PORT),
// with EXTRA_TAGS foo:bar and a:b. gostats writes a tag into the stat's
// name as ".__key=value", the keys in order. slidegate has no statsd: it
// refuses USE_STATSD=true at start with exit 2, naming the variable
// (docs/envoy.md, "A feature slidegate does not have stops the start").
// The peer runs on a Redis server of its own, first, then slidegate.
func extraTagsCase(t *testing.T, files map[string]string) suiteCase {
	sink := startStatsd(t)
	host, port, _ := net.SplitHostPort(sink.addr)
	vars := map[string]string{"USE_STATSD": "true", "DISABLE_STATS": "false", "STATSD_HOST": host, "STATSD_PORT": port,
		"STATS_FLUSH_INTERVAL": "500ms", "EXTRA_TAGS": "foo:bar,a:b", "REDIS_TIMEOUT": "10s"}
	const tags = ".__a=b.__foo=bar"
	return suiteCase{name: "TestBasicConfig_ExtraTags", files: files, env: vars, ownRedis: true,
		check: func(c *chk) {
			// The peer's key1 without its _local suffix: basic's 50 per
			// second.
			if c.call(req("basic", []string{"key1", "foo"})) == nil {
				return
			}
			for _, name := range []string{"ratelimit.service.rate_limit.basic.key1.total_hits" + tags, "ratelimit.service.config_load_success" + tags} {
				c.eventually(name+" in the statsd lines", "1", func() string { return strconv.Itoa(sink.sum(name)) })
			}
		},
		differs: []string{rowRefusedVar},
		sgCheck: func(c *chk, up bool) {
			c.exited(up, 2, regexp.MustCompile(`USE_STATSD="true": no statsd`))
		}}
}
