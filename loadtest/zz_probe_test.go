package loadtest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

func rawRequest(host string, i int) []byte {
	body := `{"key":"client-` + strconv.Itoa(i) + `","policy":"free","cost":1}`
	return []byte("POST /v1/allow HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n" + body)
}

func BenchmarkProbe(b *testing.B) {
	pols := []engine.Policy{{Name: "free", Limit: 100, Window: time.Second}}
	for _, name := range []string{"no-op", "slidegate", "slidegate-rec"} {
		b.Run(name, func(b *testing.B) {
			var tg *target
			var err error
			switch name {
			case "no-op":
				tg, err = startNoop()
			case "slidegate":
				tg, err = startMemorySlidegate(pols, nil)
			default:
				tg, err = startMemorySlidegate(pols, NewRecorder([]string{"free"}, 1<<20, 1<<26))
			}
			if err != nil {
				b.Fatal(err)
			}
			defer tg.close()
			host := strings.TrimPrefix(tg.base, "http://")
			const conns = 8
			reqs := make([][]byte, 1<<12)
			for i := range reqs {
				reqs[i] = rawRequest(host, i*7919%(1<<20))
			}
			var next atomic.Int64
			b.ReportAllocs()
			cpu0 := cpuSeconds()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / conns
			for c := 0; c < conns; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					conn, err := net.Dial("tcp", host)
					if err != nil {
						b.Error(err)
						return
					}
					defer conn.Close()
					br := bufio.NewReaderSize(conn, 4096)
					for k := 0; k < per; k++ {
						i := next.Add(1)
						if _, err := conn.Write(reqs[i&(1<<12-1)]); err != nil {
							b.Error(err)
							return
						}
						// read status line + headers
						cl := 0
						code := 0
						for {
							line, err := br.ReadSlice('\n')
							if err != nil {
								b.Error(err)
								return
							}
							if code == 0 {
								code, _ = strconv.Atoi(string(line[9:12]))
							}
							if len(line) <= 2 {
								break
							}
							if bytes.HasPrefix(line, []byte("Content-Length: ")) {
								cl, _ = strconv.Atoi(string(bytes.TrimSpace(line[16:])))
							}
						}
						if _, err := br.Discard(cl); err != nil {
							b.Error(err)
							return
						}
						if code != http.StatusOK && code != 204 && code != 429 {
							b.Error(fmt.Sprint("status ", code))
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric((cpuSeconds()-cpu0)/float64(per*conns)*1e6, "cpu-µs/req")
		})
	}
}
