package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	srv, stop := startServe(t, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	if srv == nil {
		code, log := stop()
		t.Fatalf("serve exited %d: %s", code, log)
	}
	defer stop()
	var out, errb bytes.Buffer
	if code := runHealth([]string{"http://" + srv.admin + "/readyz"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "200 OK") {
		t.Fatalf("a ready server: exit %d, %q %q", code, out.String(), errb.String())
	}

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer down.Close()
	errb.Reset()
	if code := runHealth([]string{down.URL + "/readyz"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "503") {
		t.Errorf("a 503: exit %d, %q", code, errb.String())
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	errb.Reset()
	if code := runHealth([]string{"--timeout", "5s", "http://user:hunter2@" + dead + "/readyz"}, &out, &errb); code != 1 || strings.Contains(errb.String(), "hunter2") {
		t.Errorf("nothing listening: exit %d, %q (want 1, no password)", code, errb.String())
	}

	for _, args := range [][]string{{"ftp://x"}, {"a", "b"}, {"--timeout", "0s", "http://x"}, {"--nope"}} {
		if code := runHealth(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}
