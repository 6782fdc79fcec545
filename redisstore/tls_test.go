package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/tlsfiles/tlstest"
)

// testCerts are the PEM files of a test's own certificate authority, a
// server certificate it signed (for 127.0.0.1 and redis.test, not
// localhost) and a client certificate it signed.
type testCerts struct {
	dir                  string
	ca                   string
	serverCert, serverKy string
	clientCert, clientKy string
	// mutual: the servers require a client certificate.
	mutual bool
}

// makeCerts writes a fresh CA, server and client certificates into a
// temporary directory.
func makeCerts(t testing.TB, mutual bool) *testCerts {
	t.Helper()
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "slidegate test CA")
	c := &testCerts{dir: dir, mutual: mutual, ca: ca.WriteCA(t, dir, "ca")}
	c.serverCert, c.serverKy = ca.WriteServerFor(t, dir, "server", "redis.test", "127.0.0.1", "redis.test")
	c.clientCert, c.clientKy = ca.WriteClient(t, dir, "client", "slidegate")
	return c
}

// serverArgs are redis-server's TLS options: its certificate, the CA
// that signs clients (and cluster peers), whether clients must present a
// certificate.
func (c *testCerts) serverArgs() []string {
	auth := "no"
	if c.mutual {
		auth = "yes"
	}
	// The cluster bus and replication dial peers as clients: the client
	// certificate serves them.
	return []string{"--tls-cert-file", c.serverCert, "--tls-key-file", c.serverKy, "--tls-ca-cert-file", c.ca,
		"--tls-client-cert-file", c.clientCert, "--tls-client-key-file", c.clientKy, "--tls-auth-clients", auth}
}

// cliArgs are redis-cli's options to talk to such a server.
func (c *testCerts) cliArgs() []string {
	return []string{"--tls", "--cacert", c.ca, "--cert", c.clientCert, "--key", c.clientKy}
}

// storeOptions are the options that make a store trust and present them.
func (c *testCerts) storeOptions() []Option {
	return []Option{withTLSCAFile(c.ca), withTLSClientCert(c.clientCert, c.clientKy), WithDialTimeout(loadedDial)}
}

// loadedDial bounds connecting in these tests: handshakes under -race on a
// loaded machine can take seconds, and only a hang takes this long.
const loadedDial = 30 * time.Second

var tlsSizes = backendtest.Sizes{Traces: 2, TraceSteps: 300, Goroutines: 4, PerG: 150, Resolution: time.Microsecond}

// TestTLSStandalone: a rediss:// store on a TLS-only server that requires
// client certificates (mutual TLS) runs the backend suite; without the
// CA, with a certificate for another name, or without a client
// certificate, Open refuses with an error that says why and hides the
// password.
func TestTLSStandalone(t *testing.T) {
	needRedis(t)
	certs := makeCerts(t, true)
	srv := startRedisTLS(t, false, certs, "--requirepass", "tls-s3cret")
	t.Cleanup(srv.stop)
	url := "rediss://:tls-s3cret@" + srv.addr
	p := engine.Policy{Name: "tls", Limit: 3, Window: time.Minute}

	l, err := New(url, p, append(certs.storeOptions(), WithKeyPrefix(testPrefix(t)), WithTimeout(5*time.Second), WithFailurePolicy(FailClosed))...)
	if err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
	if d, err := l.Decide(context.Background(), "k", 1); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Errorf("decision over TLS: %+v %v", d, err)
	}
	l.Close()

	refused := func(what, want string, opts ...Option) {
		t.Helper()
		_, err := New(url, p, append(opts, WithDialTimeout(loadedDial))...)
		if !errors.Is(err, ErrConnect) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "tls-s3cret") {
			t.Errorf("%s: %v, want ErrConnect saying %q without the password", what, err, want)
			return
		}
		t.Logf("%s: %v", what, err)
	}
	// The system roots do not know the test's CA.
	refused("untrusted certificate", "not signed by a trusted authority", withTLSClientCert(certs.clientCert, certs.clientKy))
	other := makeCerts(t, true)
	refused("another CA", "not signed by a trusted authority", withTLSCAFile(other.ca), withTLSClientCert(certs.clientCert, certs.clientKy))
	refused("wrong server name", "does not name the host", append(certs.storeOptions(), withTLSServerName("other.test"))...)
	refused("no client certificate", "cannot connect", withTLSCAFile(certs.ca))
	// The name the certificate holds, when the host dialled is not in it.
	l, err = New(url, p, append(certs.storeOptions(), withTLSServerName("redis.test"), WithKeyPrefix(testPrefix(t)))...)
	if err != nil {
		t.Fatalf("server name redis.test: %v", err)
	}
	l.Close()
	// TLS options need a TLS URL.
	if _, err := New("redis://"+srv.addr, p, certs.storeOptions()...); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("TLS options on redis://: %v, want ErrInvalidOption", err)
	}

	t.Run("SystemRoots", func(t *testing.T) {
		// The system roots are read once per process: a child process
		// sees SSL_CERT_FILE from its start.
		cmd := exec.Command(os.Args[0], "-test.run=^TestTLSSystemRootsChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+certs.ca, "SLIDEGATE_TLS_CHILD_URL="+url,
			"SLIDEGATE_TLS_CHILD_CERT="+certs.clientCert, "SLIDEGATE_TLS_CHILD_KEY="+certs.clientKy)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "child: decided over TLS") {
			t.Fatalf("child with SSL_CERT_FILE: %v\n%s", err, out)
		}
	})

	t.Run("Conformance", func(t *testing.T) {
		backendtest.Run(t, func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
			l, err := New(url, p, append(suiteOptions(t, clk), certs.storeOptions()...)...)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}, tlsSizes, engine.SlidingLog)
	})
}

// TestTLSSystemRootsChild runs only as TestTLSStandalone's child: with
// SSL_CERT_FILE naming the test CA and no CA option, Open trusts the
// server.
func TestTLSSystemRootsChild(t *testing.T) {
	url := os.Getenv("SLIDEGATE_TLS_CHILD_URL")
	if url == "" {
		t.Skip("runs as TestTLSStandalone's child process")
	}
	l, err := New(url, engine.Policy{Name: "roots", Limit: 1, Window: time.Second},
		withTLSClientCert(os.Getenv("SLIDEGATE_TLS_CHILD_CERT"), os.Getenv("SLIDEGATE_TLS_CHILD_KEY")),
		WithKeyPrefix(testPrefix(t)), WithDialTimeout(loadedDial), WithTimeout(5*time.Second), WithFailurePolicy(FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Decide(context.Background(), "k", 1); err != nil {
		t.Fatal(err)
	}
	fmt.Println("child: decided over TLS")
}

// TestTLSCluster: a rediss-cluster:// store on a three-master cluster
// whose clients, bus and replication all use TLS (tls-cluster yes) sees
// every master and runs the backend suite.
func TestTLSCluster(t *testing.T) {
	needRedis(t)
	certs := makeCerts(t, true)
	var nodes []*redisProc
	var addrs []string
	for range 3 {
		p := startRedisTLS(t, true, certs, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
			"--tls-cluster", "yes", "--tls-replication", "yes", "--cluster-require-full-coverage", "no")
		t.Cleanup(p.stop)
		nodes = append(nodes, p)
		addrs = append(addrs, p.addr)
	}
	args := append(certs.cliArgs(), "--cluster", "create")
	args = append(append(args, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		for {
			out, _ := n.cli("cluster", "info")
			if strings.Contains(out, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("TLS cluster node %s not ready: %s", n.addr, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	url := "rediss-cluster://" + strings.Join(addrs, ",")
	st, err := Open(url, append(certs.storeOptions(), WithKeyPrefix(testPrefix(t)))...)
	if err != nil {
		t.Fatal(err)
	}
	masters, _, err := st.conn.masters(context.Background())
	st.Close()
	if err != nil || len(masters) != 3 {
		t.Fatalf("masters over TLS: %v %v", masters, err)
	}
	if _, err := Open(url); !errors.Is(err, ErrConnect) || !strings.Contains(err.Error(), "trusted authority") {
		t.Errorf("cluster without the CA: %v", err)
	}
	backendtest.Run(t, func(t *testing.T, p engine.Policy, clk engine.Clock) engine.Backend {
		l, err := New(url, p, append(suiteOptions(t, clk), certs.storeOptions()...)...)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}, tlsSizes, engine.SlidingLog, engine.SlidingCounter)
}

// TestValkeyURLs: the valkey schemes reach a real server as their redis
// ones do (Valkey speaks Redis's protocol; redis-server stands in for
// it): standalone, Cluster, and TLS with a client certificate.
func TestValkeyURLs(t *testing.T) {
	needRedis(t)
	p := engine.Policy{Name: "valkey", Limit: 2, Window: time.Minute}
	decide := func(url string, opts ...Option) {
		t.Helper()
		l, err := New(url, p, append(opts, WithKeyPrefix(testPrefix(t)), WithTimeout(5*time.Second), WithFailurePolicy(FailClosed))...)
		if err != nil {
			t.Fatalf("%s: %v", redact(url), err)
		}
		defer l.Close()
		for i, want := range []bool{true, true, false} {
			if d, err := l.Decide(context.Background(), "k", 1); err != nil || d.Allowed != want {
				t.Errorf("%s, request %d: %+v %v; want allowed %v", redact(url), i+1, d, err, want)
			}
		}
	}
	decide("valkey://" + standaloneAddr(t) + "/0")
	decide("valkey-cluster://" + strings.Join(clusterAddrs(t), ","))
	certs := makeCerts(t, true)
	srv := startRedisTLS(t, false, certs, "--requirepass", "valkey-s3cret")
	t.Cleanup(srv.stop)
	decide("valkeys://:valkey-s3cret@"+srv.addr, certs.storeOptions()...)
}
