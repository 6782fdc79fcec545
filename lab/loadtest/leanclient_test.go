package loadtest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/slidegate/slidegate/engine"
)

// capturedRequest sends req's copy through client to a listener that
// keeps the request's bytes and answers 204, and returns the bytes.
func capturedRequest(t *testing.T, client *http.Client, tgt vegeta.Target) []byte {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := lis.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var b []byte
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				got <- nil
				return
			}
			b = append(b, line...)
			if len(line) <= 2 {
				break
			}
		}
		body := make([]byte, len(tgt.Body))
		if _, err := io.ReadFull(br, body); err != nil {
			got <- nil
			return
		}
		got <- append(b, body...)
		_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
	}()
	tgt.URL = "http://" + lis.Addr().String() + tgt.URL
	req, err := tgt.Request()
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Vegeta-Attack", "capacity round 1")
	req.Header.Set("X-Vegeta-Seq", "12")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Status != "204 No Content" {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Status)
	}
	b := <-got
	if b == nil {
		t.Fatal("no request read")
	}
	client.CloseIdleConnections()
	return b
}

// TestLeanTransportWritesAsNetHTTP: the capacity slices' transport sends
// the bytes net/http's sends for vegeta's request (the same header lines
// in the same order), so that the servers parse the same requests.
func TestLeanTransportWritesAsNetHTTP(t *testing.T) {
	cfg := DefaultConfig()
	tgt := vegeta.Target{Method: http.MethodPost, URL: "/v1/allow", Body: []byte(`{"key":"c-1","policy":"free","cost":1}`),
		Header: http.Header{"Content-Type": []string{"application/json"}}}
	want := capturedRequest(t, netHTTPClient(cfg), tgt)
	got := capturedRequest(t, newLeanClient(cfg), tgt)
	// The listeners' ports differ: compare with the Host line's port cut.
	host := func(b []byte) []byte {
		i := bytes.Index(b, []byte("Host: 127.0.0.1:"))
		j := bytes.IndexByte(b[i:], '\r')
		return append(append([]byte(nil), b[:i]...), b[i+j:]...)
	}
	if !bytes.Equal(host(got), host(want)) {
		t.Errorf("lean transport wrote\n%q\nnet/http writes\n%q", got, want)
	}
}

// TestLeanTransportAnswers: against the capacity phase's servers, the
// lean client reads 204 (no-op), 200 and, past the limit, 429
// (slidegate) on kept-alive connections, with the status texts net/http
// gives.
func TestLeanTransportAnswers(t *testing.T) {
	pols := []engine.Policy{{Name: "free", Limit: 3, Window: time.Hour}}
	sg, err := startMemorySlidegate(pols, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sg.close()
	noop, err := startNoop()
	if err != nil {
		t.Fatal(err)
	}
	defer noop.close()
	cfg := DefaultConfig()
	client := newLeanClient(cfg)
	defer client.CloseIdleConnections()
	do := func(base string) *http.Response {
		t.Helper()
		tgt := vegeta.Target{Method: http.MethodPost, URL: base + "/v1/allow", Body: []byte(`{"key":"c-1","policy":"free","cost":1}`),
			Header: http.Header{"Content-Type": []string{"application/json"}}}
		req, err := tgt.Request()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var codes []string
	for range 5 {
		codes = append(codes, do(sg.base).Status)
	}
	codes = append(codes, do(noop.base).Status)
	want := "200 OK,200 OK,200 OK,429 Too Many Requests,429 Too Many Requests,204 No Content"
	if got := strings.Join(codes, ","); got != want {
		t.Errorf("statuses %s, want %s", got, want)
	}
	lt := client.Transport.(*leanTransport)
	if n := len(lt.sem); n != 2 {
		t.Errorf("%d connections open after 6 requests to 2 servers one at a time, want 2 (kept alive)", n)
	}
}

// TestLeanTransportConnection: an answer with Connection: close closes
// its connection; a chunked answer is an error; a server that does not
// answer fails the request by the timeout.
func TestLeanTransportConnection(t *testing.T) {
	for _, c := range []struct {
		name, answer string
		err          bool
		open         int
	}{
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false, 0},
		{"keep", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false, 1},
		// Names in any case; a name of a read one's length is not it.
		{"close, any case", "HTTP/1.1 200 OK\r\nAccept-Charset: 9\r\nconnection:  Close \r\ncontent-length:2\r\n\r\nok", false, 0},
		{"same lengths", "HTTP/1.1 200 OK\r\nAccept-Charset: 9\r\nTransfer-Encodinx: chunked\r\nConnectiox: close\r\nContent-Length: 2\r\n\r\nok", false, 1},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true, 0},
		{"no length", "HTTP/1.1 200 OK\r\n\r\nok", true, 0},
		{"silent", "", true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			base, stop, err := startCanned([]byte(c.answer))
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			cfg := DefaultConfig()
			cfg.Timeout = 300 * time.Millisecond
			client := newLeanClient(cfg)
			defer client.CloseIdleConnections()
			req, err := http.NewRequest(http.MethodPost, base+"/v1/allow", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if (err != nil) != c.err {
				t.Fatalf("error %v, want one: %v", err, c.err)
			}
			if err == nil && resp.StatusCode != http.StatusOK {
				t.Errorf("status %d", resp.StatusCode)
			}
			if n := len(client.Transport.(*leanTransport).sem); n != c.open {
				t.Errorf("%d connections open, want %d", n, c.open)
			}
		})
	}
}

// TestCapacityClientAllocsPerAnswer: the capacity slices' client
// allocates as much for slidegate's answer (a 200 with a JSON body, with
// the default headers and with every family --capacity-headers turns on)
// as for the no-op's 204, through a real listener: reading the answer is
// not what the slices measure.
// net/http's transport (netHTTPClient) allocated a dozen more per
// answer for slidegate's.
func TestCapacityClientAllocsPerAnswer(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	pols := []engine.Policy{{Name: "free", Limit: 1 << 20, Window: time.Hour}}
	allocs := map[string]float64{}
	for _, name := range []string{"no-op", "slidegate", "slidegate+draft,x"} {
		base, stop, err := cannedAnswerOf(name, pols)
		if err != nil {
			t.Fatal(err)
		}
		client := newLeanClient(DefaultConfig())
		tgt := vegeta.Target{Method: http.MethodPost, URL: base + "/v1/allow", Body: []byte(`{"key":"c-1","policy":"free","cost":1}`),
			Header: http.Header{"Content-Type": []string{"application/json"}}}
		var mu sync.Mutex
		hit := func() {
			mu.Lock()
			defer mu.Unlock()
			req, err := tgt.Request()
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
		}
		hit()
		allocs[name] = testing.AllocsPerRun(2000, hit)
		client.CloseIdleConnections()
		stop()
	}
	for _, name := range []string{"slidegate", "slidegate+draft,x"} {
		if allocs[name] > allocs["no-op"] {
			t.Errorf("allocations per answer: %s's %v, the no-op's %v; want no more for slidegate's", name, allocs[name], allocs["no-op"])
		}
	}
}

// TestLeanTransportRetriesClosedIdle: a request on a kept-alive
// connection that the server closed while it was idle is sent again on
// a new connection (as net/http's transport does), once.
func TestLeanTransportRetriesClosedIdle(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer lis.Close() // before the wait: the accept loop ends with it
	accepted := make(chan struct{}, 8)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			// One answer, then the connection closes without saying so.
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadSlice('\n')
				if err != nil || len(line) <= 2 {
					break
				}
			}
			_, _ = br.Discard(2)
			_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
			_ = c.Close()
		}
	}()
	client := newLeanClient(DefaultConfig())
	defer client.CloseIdleConnections()
	for i := range 3 {
		req, err := http.NewRequest(http.MethodPost, "http://"+lis.Addr().String()+"/v1/allow", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		// Let the server's close reach the idle connection first.
		time.Sleep(20 * time.Millisecond)
	}
	_ = lis.Close()
	if n := len(accepted); n != 3 {
		t.Errorf("%d connections for 3 requests, want 3", n)
	}
}

// cannedAnswerOf starts target name ("no-op"; "slidegate", slidegate's
// server over pols; "slidegate+draft,x", the same with the decision API's
// draft and x families on), takes one answer from it, stops it, and
// serves that answer's bytes from startCanned, so that a client's cost
// per answer is measured without the server's.
func cannedAnswerOf(name string, pols []engine.Policy) (base string, stop func(), err error) {
	var tg *target
	switch name {
	case "no-op":
		tg, err = startNoop()
	case "slidegate+draft,x":
		tg, err = startMemorySlidegate(pols, nil, withDecisionHeaders(headersDraft, headersX))
	default:
		tg, err = startMemorySlidegate(pols, nil)
	}
	if err != nil {
		return "", nil, err
	}
	answer, err := oneAnswer(tg.base)
	tg.close()
	if err != nil {
		return "", nil, err
	}
	return startCanned(answer)
}
