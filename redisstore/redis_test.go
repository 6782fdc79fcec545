package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"
)

// The tests run against real redis-server processes. `make test` (through
// scripts/redis-env.sh) starts one standalone server and one three-master
// cluster and exports their addresses; without them (a plain `go test`),
// the tests start their own when redis-server is installed, and skip with
// a message otherwise. Tests that kill, stop or stall a server always start
// their own.
const (
	envAddr        = "SLIDEGATE_REDIS_ADDR"
	envClusterAddr = "SLIDEGATE_REDIS_CLUSTER_ADDRS"
)

var shared struct {
	mu      sync.Mutex
	procs   []*redisProc
	addr    string
	cluster []string
}

func TestMain(m *testing.M) {
	// SLIDEGATE_REDIS_EVALSHA runs every test on the EVALSHA path, which
	// stores take where Redis refuses Functions.
	functionsOff = os.Getenv("SLIDEGATE_REDIS_EVALSHA") != ""
	code := m.Run()
	shared.mu.Lock()
	for _, p := range shared.procs {
		p.stop()
	}
	shared.mu.Unlock()
	if code == 0 {
		// rueidis closes connections it replaced on a cluster topology
		// refresh from a goroutine that sleeps 5 s first, and a cluster
		// client that failed to start may have a delayed refresh asleep
		// (under a second); they end by themselves and hold no resource
		// of ours.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// needRedis skips t when there is no Redis to test against. Under make
// test the environment names servers, so nothing is ever skipped there.
func needRedis(t testing.TB) {
	t.Helper()
	if os.Getenv(envAddr) != "" {
		if _, err := exec.LookPath("redis-server"); err != nil {
			t.Fatalf("%s is set but redis-server is not on PATH: %v", envAddr, err)
		}
		return
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed: run `make test` (installs it and starts servers) or set " + envAddr)
	}
}

// standaloneAddr returns the shared standalone server's address.
func standaloneAddr(t testing.TB) string {
	t.Helper()
	needRedis(t)
	if a := os.Getenv(envAddr); a != "" {
		return a
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.addr == "" {
		p := startRedis(t, false)
		shared.procs = append(shared.procs, p)
		shared.addr = p.addr
	}
	return shared.addr
}

// clusterAddrs returns the shared three-master cluster's addresses.
func clusterAddrs(t testing.TB) []string {
	t.Helper()
	needRedis(t)
	if a := os.Getenv(envClusterAddr); a != "" {
		return strings.Split(a, ",")
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		var addrs []string
		for range 3 {
			p := startRedis(t, true, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no")
			shared.procs = append(shared.procs, p)
			addrs = append(addrs, p.addr)
		}
		args := append([]string{"--cluster", "create"}, addrs...)
		args = append(args, "--cluster-replicas", "0", "--cluster-yes")
		if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
			t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
		}
		waitClusterOK(t, addrs)
		shared.cluster = addrs
	}
	return shared.cluster
}

func waitClusterOK(t testing.TB, addrs []string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		for {
			out, _ := cli(a, "cluster", "info")
			if strings.Contains(out, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s not ready: %s", a, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// stateKeys returns the Redis keys where Decide keeps client's state
// under l: its own key, and its bucket if it has one.
func stateKeys(l *Limiter, client string) []string {
	if b, ok := l.bucketIn(slotOf(client), client); ok {
		return []string{l.Key(client), b}
	}
	return []string{l.Key(client)}
}

func cli(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return string(out), err
}

// cli runs redis-cli on p, over TLS if p serves TLS.
func (p *redisProc) cli(args ...string) (string, error) {
	if p.tls != nil {
		args = append(p.tls.cliArgs(), args...)
	}
	return cli(p.addr, args...)
}

// redisProc is a redis-server process owned by a test.
type redisProc struct {
	addr string
	port int
	dir  string
	args []string
	tls  *testCerts // nil: plain TCP; else the TLS port only, with these certificates
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts a redis-server on a free loopback port. Cluster nodes
// need their bus port (port + 10000) free too.
func startRedis(t testing.TB, cluster bool, extra ...string) *redisProc {
	t.Helper()
	return startRedisTLS(t, cluster, nil, extra...)
}

// startRedisTLS is startRedis serving TLS only (no plain port) with
// certs, when certs is not nil.
func startRedisTLS(t testing.TB, cluster bool, certs *testCerts, extra ...string) *redisProc {
	t.Helper()
	dir, err := os.MkdirTemp("", "slidegate-redis-test")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		port := freePort(t, cluster)
		p := &redisProc{addr: "127.0.0.1:" + strconv.Itoa(port), port: port, dir: dir, args: extra, tls: certs}
		if err := p.start(); err == nil {
			return p
		}
	}
	t.Fatalf("could not start redis-server")
	return nil
}

func freePort(t testing.TB, cluster bool) int {
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !cluster || port+10000 < 65536 {
			if cluster {
				if ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
					ln2.Close()
					return port
				}
				continue
			}
			return port
		}
	}
}

// start (re)starts the process on its port and waits until it answers.
func (p *redisProc) start() error {
	port := []string{"--port", strconv.Itoa(p.port)}
	if p.tls != nil {
		port = append([]string{"--port", "0", "--tls-port", strconv.Itoa(p.port)}, p.tls.serverArgs()...)
	}
	args := []string{
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", p.dir, "--enable-debug-command", "local",
		"--cluster-config-file", filepath.Join(p.dir, "nodes-"+strconv.Itoa(p.port)+".conf"),
	}
	args = append(append(port, args...), p.args...)
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd = cmd
	p.done = make(chan struct{})
	go func() { cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("redis-server exited")
		default:
		}
		if out, err := p.cli("ping"); err == nil && strings.Contains(out, "PONG") || strings.Contains(out, "NOAUTH") {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.kill()
	return fmt.Errorf("redis-server on %s did not answer", p.addr)
}

// kill stops the server at once (SIGKILL), as a crash would.
func (p *redisProc) kill() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

func (p *redisProc) stop() {
	p.kill()
	os.RemoveAll(p.dir)
}

func (p *redisProc) signal(s syscall.Signal) {
	if p.cmd != nil {
		p.cmd.Process.Signal(s)
	}
}

// ownRedis starts a standalone server for one test, stopped at its end.
func ownRedis(t testing.TB, extra ...string) *redisProc {
	t.Helper()
	needRedis(t)
	p := startRedis(t, false, extra...)
	t.Cleanup(p.stop)
	return p
}

var nameClean = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// testPrefix returns a key prefix unique to the test (the shared servers
// outlive tests).
func testPrefix(t testing.TB) string {
	return "t:" + nameClean.ReplaceAllString(t.Name(), "_") + ":" + strconv.FormatUint(rand.Uint64()&0xffffff, 16) + ":"
}

// rawClient returns a plain client for inspecting a server.
func rawClient(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true, ForceSingleClient: len(addrs) == 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// logCount returns how many entries client's log under l holds (live or
// not yet evicted), wherever Decide keeps it: 1 for its field in its
// bucket or the compact form in its own key (a decimal instant), else the
// count the ring's header keeps.
func logCount(t testing.TB, c rueidis.Client, l *Limiter, client string) int {
	t.Helper()
	ctx := context.Background()
	b, err := c.Do(ctx, c.B().Get().Key(l.Key(client)).Build()).AsBytes()
	if rueidis.IsRedisNil(err) {
		bk, ok := l.bucketIn(slotOf(client), client)
		if !ok {
			return 0
		}
		n, err := c.Do(ctx, c.B().Hexists().Key(bk).Field(client).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return int(n)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 24 {
		return 1
	}
	return int(uint32(b[20]) | uint32(b[21])<<8 | uint32(b[22])<<16 | uint32(b[23])<<24)
}

// stallRedis makes the server at addr sleep for secs seconds (DEBUG
// SLEEP), which blocks every client. The command is written on a plain
// connection before stallRedis returns, so a command another connection
// sends afterwards becomes readable on the server after it, and Redis
// handles readable connections in that order: it runs after the sleep,
// however late the test's goroutines or the server get a core.
// The channel closes when the server has answered the sleep.
func stallRedis(t testing.TB, addr, secs string) <-chan struct{} {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$%d\r\n%s\r\n", len(secs), secs)
	if _, err := c.Write([]byte(cmd)); err != nil {
		c.Close()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang bound
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || line != "+OK\r\n" {
			t.Errorf("DEBUG SLEEP %s: %q %v", secs, line, err)
		}
	}()
	// The sleep itself starts once the server reads the command; a short
	// wait lets it, as the tests' timing assumes, on a quiet machine.
	time.Sleep(30 * time.Millisecond)
	return done
}
