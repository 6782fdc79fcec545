package connlimit_test

import (
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/slidegate/slidegate/internal/connlimit"
)

// BenchmarkKeepAlive is keep-alive requests through a real loopback
// listener, plain and wrapped: what the connection tracking costs a
// request (two ConnState transitions, each an atomic word of its own).
func BenchmarkKeepAlive(b *testing.B) {
	for _, wrapped := range []bool{false, true} {
		name := "plain"
		if wrapped {
			name = "connlimit"
		}
		b.Run(name, func(b *testing.B) {
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })}
			var lis net.Listener = inner
			if wrapped {
				l := connlimit.New(inner, connlimit.Config{MaxConns: 10000, MaxPerAddr: 100})
				srv.ConnState = l.ConnState
				lis = l
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(lis) }()
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			client := &http.Client{Transport: tr}
			url := "http://" + inner.Addr().String() + "/"
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Get(url)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			b.StopTimer()
			tr.CloseIdleConnections()
			_ = srv.Close()
			<-done
		})
	}
}
