package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperProcess is slidegate itself when run by the tests below as a
// child process (the usual os/exec helper pattern); otherwise it does
// nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv("SLIDEGATE_HELPER") != "1" {
		t.Skip("helper process only")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(dispatch(args, os.Stdout, os.Stderr))
}

// TestServeSIGTERM runs slidegate serve as a real process in gateway mode,
// sends SIGTERM while a request is in flight at the upstream, and checks
// that the request still gets its answer and the process exits 0.
func TestServeSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "slow answer")
	}))
	defer up.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "--",
		"serve", "--listen", "127.0.0.1:0", "--admin", "off", "--upstream", up.URL, "--key", "header:X-Client")
	cmd.Env = append(os.Environ(), "SLIDEGATE_HELPER=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stderr)
	listen := regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`)
	var addr string
	var log strings.Builder
	for lines.Scan() {
		log.WriteString(lines.Text() + "\n")
		if m := listen.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
			break
		}
	}
	if addr == "" {
		t.Fatalf("no listen address in the log:\n%s", log.String())
	}
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for lines.Scan() {
			b.WriteString(lines.Text() + "\n")
		}
		rest <- b.String()
	}()

	type res struct {
		status int
		body   string
		err    error
	}
	done := make(chan res, 1)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	go func() {
		req, _ := http.NewRequest("GET", "http://"+addr+"/x", nil)
		req.Header.Set("X-Client", "c1")
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			done <- res{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- res{status: resp.StatusCode, body: string(b)}
	}()
	<-arrived
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Shutdown has begun once the listener refuses connections; the
	// request is still in flight at the upstream. Then let it answer.
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(time.Millisecond)
	}
	select {
	case r := <-done:
		t.Fatalf("the in-flight request ended before the upstream answered: %+v", r)
	default:
	}
	close(release)
	r := <-done
	if r.err != nil || r.status != 200 || r.body != "slow answer" {
		t.Errorf("in-flight request: %d %q %v", r.status, r.body, r.err)
	}
	err = cmd.Wait()
	out := <-rest
	if err != nil {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	if !strings.Contains(out, "shutting down") || !strings.Contains(out, "stopped") {
		t.Errorf("log after SIGTERM:\n%s", out)
	}
}
