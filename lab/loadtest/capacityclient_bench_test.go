package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/engine"
)

// BenchmarkCapacityClient is the harness's own work per answer in the
// capacity slices: vegeta's closed loop, the results file and the
// metrics, as runAttack runs them, against a server that answers every
// request with the same canned bytes. The bytes are one answer of each
// capacity target (the no-op's 204; slidegate's 200 with its headers and
// JSON body), taken from the real servers. The canned server's own work
// is the same for both, so slidegate's CPU per request less the no-op's
// is what reading slidegate's longer answer costs the client: with
// net/http's transport (net/http) and with the slices' own (lean,
// leanTransport).
//
//	go test -run '^$' -bench CapacityClient -benchtime 100000x -count 5 ./loadtest
func BenchmarkCapacityClient(b *testing.B) {
	pols := []engine.Policy{{Name: "free", Limit: 100, Window: time.Second}}
	for _, run := range []struct{ name, client string }{{"no-op", "net/http"}, {"slidegate", "net/http"}, {"no-op", "lean"}, {"slidegate", "lean"}} {
		name := run.name
		b.Run(run.client+"/"+name, func(b *testing.B) {
			base, stop, err := cannedAnswerOf(name, pols)
			if err != nil {
				b.Fatal(err)
			}
			defer stop()
			cfg := DefaultConfig()
			cfg.Tiers = []string{"free"}
			client := netHTTPClient(cfg)
			if run.client == "lean" {
				client = newLeanClient(cfg)
			}
			defer client.CloseIdleConnections()
			rf, err := newResultFile(filepath.Join(b.TempDir(), "results.bin"))
			if err != nil {
				b.Fatal(err)
			}
			rf.noHeaders = true
			a := attack{base: base, policies: pols, pacer: vegeta.ConstantPacer{}, dur: time.Hour,
				maxHits: uint64(b.N), name: "bench", results: rf}
			b.ReportAllocs()
			cpu0 := cpuSeconds()
			b.ResetTimer()
			res, err := runAttack(context.Background(), cfg, newClosedAttacker(cfg, client), a, nil)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if err := rf.close(); err != nil {
				b.Fatal(err)
			}
			if res.errors > 0 || res.allowed != int64(b.N) {
				b.Fatalf("%d allowed, %d errors of %d", res.allowed, res.errors, b.N)
			}
			b.ReportMetric((cpuSeconds()-cpu0)/float64(b.N)*1e6, "cpu-µs/req")
		})
	}
}

// oneAnswer sends one decision request to base and returns its answer's
// bytes as the server wrote them.
func oneAnswer(base string) ([]byte, error) {
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	body := `{"key":"` + clientKey(1) + `","policy":"free","cost":1}`
	req := "POST /v1/allow HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) +
		"\r\nContent-Type: application/json\r\n\r\n" + body
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	var out []byte
	length := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		out = append(out, line...)
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
				return nil, err
			}
		}
	}
	rest := make([]byte, length)
	if _, err := io.ReadFull(br, rest); err != nil {
		return nil, err
	}
	return append(out, rest...), nil
}

// startCanned serves answer to every request on a loopback listener.
func startCanned(answer []byte) (base string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = serveCanned(c, answer)
			}()
		}
	}()
	return "http://" + lis.Addr().String(), func() {
		_ = lis.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}, nil
}

// serveCanned answers each request read from c with answer.
func serveCanned(c net.Conn, answer []byte) error {
	br := bufio.NewReaderSize(c, 4096)
	for {
		length := 0
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return err
			}
			if len(line) <= 2 {
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				if length, err = strconv.Atoi(string(bytes.TrimSpace(v))); err != nil {
					return err
				}
			}
		}
		if _, err := br.Discard(length); err != nil {
			return err
		}
		if _, err := c.Write(answer); err != nil {
			return errors.Join(err, c.Close())
		}
	}
}

// netHTTPClient is the capacity slices' client before leanTransport:
// net/http's transport with cfg.Connections keep-alive HTTP/1.1
// connections per host, no proxy.
func netHTTPClient(cfg Config) *http.Client {
	d := &net.Dialer{KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: cfg.Connections,
		MaxConnsPerHost:     cfg.Connections,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return &http.Client{Transport: tr, Timeout: cfg.Timeout}
}
