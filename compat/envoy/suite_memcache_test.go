package envoy

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The peer's three memcached tests (TestBasicConfigMemcache,
// TestConfigMemcacheWithMaxIdleConns, TestMultiNodeMemcache): its basic
// test on BACKEND_TYPE=memcache, against memcached processes started
// here on loopback. slidegate has no memcached backend: it refuses
// BACKEND_TYPE=memcache at start with exit 2, naming the variable
// (docs/envoy.md, "A feature slidegate does not have stops the start").

// memcached is one memcached process on a loopback port.
type memcached struct{ addr string }

// startMemcached runs memcached on a free port until the test ends and
// waits until it answers.
func startMemcached(t *testing.T) *memcached {
	t.Helper()
	port := freePort(t)
	args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "16"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root") // memcached refuses root without it
	}
	cmd := exec.Command("memcached", args...)
	out := &lockedBuf{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("memcached: %v (compat/envoy/peer-env.sh installs it)", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	m := &memcached{addr: "127.0.0.1:" + strconv.Itoa(port)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := m.cmd("version"); err == nil {
			return m
		}
		select {
		case <-done:
			t.Fatalf("memcached exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached on %s did not answer within 30 s", m.addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cmd sends one text-protocol command and reads its answer up to its
// last line (END, OK or VERSION).
func (m *memcached) cmd(line string) ([]string, error) {
	conn, err := net.DialTimeout("tcp", m.addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(conn, "%s\r\n", line); err != nil {
		return nil, err
	}
	var lines []string
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		lines = append(lines, l)
		if l == "END" || l == "OK" || strings.HasPrefix(l, "VERSION") || strings.Contains(l, "ERROR") {
			return lines, nil
		}
	}
	return lines, fmt.Errorf("memcached %s: %q: no end (%v)", m.addr, line, sc.Err())
}

// writes is incr_hits + cmd_set: the peer's increments of existing keys
// and its adds of new ones (each keyed descriptor is one of the two).
func (m *memcached) writes() (int, error) {
	lines, err := m.cmd("stats")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "STAT" && (f[1] == "incr_hits" || f[1] == "cmd_set") {
			v, _ := strconv.Atoi(f[2])
			n += v
		}
	}
	return n, nil
}

// settler waits after each of the peer's answers until memcached holds
// its increments. The peer's test makes them synchronous in process
// (AutoFlushForIntegrationTests); the service increments after it
// answers. A keyed descriptor (one with a limit) is one write, unless
// the peer's local cache already held it over its limit.
func settler(c *chk, nodes []*memcached, localCache bool) func(*rlsv3.RateLimitRequest, *rlsv3.RateLimitResponse) {
	total := func() int {
		n := 0
		for _, m := range nodes {
			w, err := m.writes()
			if err != nil {
				c.errorf("%v", err)
				return -1
			}
			n += w
		}
		return n
	}
	want := total()
	overSeen := map[string]bool{}
	return func(r *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
		for i, st := range resp.Statuses {
			if st.CurrentLimit == nil || i >= len(r.Descriptors) {
				continue
			}
			key := reqString(&rlsv3.RateLimitRequest{Domain: r.Domain, Descriptors: r.Descriptors[i : i+1]})
			if localCache && overSeen[key] {
				continue
			}
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				overSeen[key] = true
			}
			want++
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := total()
			if got < 0 || got >= want {
				return
			}
			if time.Now().After(deadline) {
				c.errorf("memcached: %d writes after 30 s, want %d", got, want)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// memcacheCases are the three tests' variants.
func memcacheCases(t *testing.T, files map[string]string, redisAddr string) []suiteCase {
	single := []*memcached{startMemcached(t)}
	multi := []*memcached{startMemcached(t), startMemcached(t)}
	variant := func(name string, nodes []*memcached, localCache int, extra map[string]string) suiteCase {
		var addrs []string
		for _, m := range nodes {
			addrs = append(addrs, m.addr)
		}
		// REDIS_URL given: the peer's launch leaves the shared Redis
		// alone; the memcache backend does not use it.
		vars := map[string]string{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": strings.Join(addrs, ","), "REDIS_URL": redisAddr}
		if localCache > 0 {
			vars["LOCAL_CACHE_SIZE_IN_BYTES"] = strconv.Itoa(localCache)
		}
		for k, v := range extra {
			vars[k] = v
		}
		refused := `BACKEND_TYPE="memcache": `
		if localCache > 0 {
			refused = `LOCAL_CACHE_SIZE_IN_BYTES="` + strconv.Itoa(localCache) + `": ` // listed before BACKEND_TYPE
		}
		return suiteCase{name: name, files: files, env: vars, group: "memcache",
			before: func(t *testing.T) {
				for _, m := range nodes {
					if _, err := m.cmd("flush_all"); err != nil {
						t.Fatal(err)
					}
				}
			},
			check: func(c *chk) {
				c.settle = settler(c, nodes, localCache > 0)
				integBasic(c, localCache > 0, false)
			},
			differs: []string{rowRefusedVar},
			sgCheck: func(c *chk, up bool) { c.exited(up, 2, regexp.MustCompile(regexp.QuoteMeta(refused))) }}
	}
	return []suiteCase{
		variant("TestBasicConfigMemcache/Memcache", single, 0, nil),
		variant("TestBasicConfigMemcache/MemcacheWithLocalCache", single, 1000, nil),
		variant("TestBasicConfigMemcache/MemcacheWithPrefix", single, 0, map[string]string{"CACHE_KEY_PREFIX": "prefix:"}),
		// The peer's test also asserts its settings' default of 2 idle
		// connections, which no port shows.
		variant("TestConfigMemcacheWithMaxIdleConns/MemcacheWithDefaultMaxIdleConns", single, 0, nil),
		variant("TestConfigMemcacheWithMaxIdleConns/MemcacheWithSpecifiedMaxIdleConns", single, 0, map[string]string{"MEMCACHE_MAX_IDLE_CONNS": "100"}),
		variant("TestMultiNodeMemcache/MemcacheMultipleNodes", multi, 0, nil),
	}
}
