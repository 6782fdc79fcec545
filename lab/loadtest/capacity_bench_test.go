package loadtest

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// BenchmarkCapacityServers is the capacity phase's two servers (the no-op
// handler, and slidegate's server on the in-memory engine, with and
// without the harness's recorder, and with the decision API's draft pair,
// and the draft pair and the X-RateLimit-* trio, turned on:
// --capacity-headers draft, draft,x) under a minimal client: 8 keep-alive
// connections writing pre-rendered requests (the bodies and headers
// vegeta sends) and reading the answers, with no parsing beyond the
// status and the length. allocs/op and B/op are the servers' own
// (the client allocates nothing per request), and cpu-µs/req is the
// process's CPU per request, the client's two system calls included:
// what the capacity slices cannot separate from vegeta's much larger share
// (the phase's cost rounds measure it with the same client, rawClient).
//
//	go test -run '^$' -bench CapacityServers -benchtime 200000x -count 5 ./loadtest
func BenchmarkCapacityServers(b *testing.B) {
	pols := []engine.Policy{{Name: "free", Limit: 100, Window: time.Second}}
	for _, name := range []string{"no-op", "slidegate", "slidegate+recorder", "slidegate+draft", "slidegate+draft+x"} {
		b.Run(name, func(b *testing.B) {
			var tg *target
			var err error
			switch name {
			case "no-op":
				tg, err = startNoop()
			case "slidegate":
				tg, err = startMemorySlidegate(pols, nil)
			case "slidegate+draft":
				tg, err = startMemorySlidegate(pols, nil, withDecisionHeaders(headersDraft))
			case "slidegate+draft+x":
				tg, err = startMemorySlidegate(pols, nil, withDecisionHeaders(headersDraft, headersX))
			default:
				tg, err = startMemorySlidegate(pols, newRecorder([]string{"free"}, 1<<20, b.N+1))
			}
			if err != nil {
				b.Fatal(err)
			}
			defer tg.close()
			host := strings.TrimPrefix(tg.base, "http://")
			const conns, nreq = 8, 1 << 12
			reqs := make([][]byte, nreq)
			for i := range reqs {
				body := `{"key":"` + clientKey(i*7919%(1<<20)) + `","policy":"free","cost":1}`
				reqs[i] = []byte("POST /v1/allow HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: Go-http-client/1.1\r\n" +
					"Content-Length: " + strconv.Itoa(len(body)) + "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n" + body)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			per := b.N / conns
			b.ReportAllocs()
			cpu0 := cpuSeconds()
			b.ResetTimer()
			for range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, _, err := rawClient(host, per, func() []byte { return reqs[next.Add(1)&(nreq-1)] }); err != nil {
						b.Error(err)
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric((cpuSeconds()-cpu0)/float64(per*conns)*1e6, "cpu-µs/req")
		})
	}
}
