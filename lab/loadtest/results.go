package loadtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// HTTP figures come from one estimator: vegeta.Metrics, fed with the
// results in the order they are saved. The results are saved in vegeta's
// own encoding (gob, what `vegeta attack` writes), so
//
//	vegeta report http-results.bin
//
// prints the same requests, rate, throughput and percentiles as the
// report, and `vegeta plot` and `vegeta report -type=hdrplot` can be rerun
// on them. Timestamps are saved without Go's monotonic clock reading (the
// encoding cannot carry it), and the harness's metrics see them the same
// way, so that durations and rates agree to the last digit.

// resultFile saves results in vegeta's encoding. It is not safe for
// concurrent use (vegeta's attack channel delivers results to one
// reader). A nil *resultFile keeps nothing.
type resultFile struct {
	path string
	f    *os.File
	w    *bufio.Writer
	enc  vegeta.Encoder
	err  error
	// noHeaders drops the response headers too (the capacity phase):
	// vegeta report and plot do not read them.
	noHeaders bool
}

// newResultFile creates path.
func newResultFile(path string) (*resultFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("loadtest: results: %w", err)
	}
	s := &resultFile{path: path, f: f, w: bufio.NewWriterSize(f, 1<<16)}
	s.enc = vegeta.NewEncoder(s.w)
	return s, nil
}

// add saves one result, as the encoding keeps it: the timestamp without
// its monotonic reading, the body dropped (BytesIn keeps its size).
// Callers add r to their metrics after add, so that both see the same
// values.
func (s *resultFile) add(r *vegeta.Result) {
	r.Timestamp = r.Timestamp.Round(0)
	r.Body = nil
	if s != nil && s.noHeaders {
		r.Headers = nil
	}
	if s != nil && s.err == nil {
		s.err = s.enc.Encode(r)
	}
}

// close flushes and closes the file.
func (s *resultFile) close() error {
	if s == nil || s.f == nil {
		return nil
	}
	s.err = errors.Join(s.err, s.w.Flush(), s.f.Close())
	s.f = nil
	if s.err != nil {
		return fmt.Errorf("loadtest: results %s: %w", s.path, s.err)
	}
	return nil
}

// readMetrics computes vegeta.Metrics over a saved results file, as
// `vegeta report` does.
func readMetrics(r io.Reader) (vegeta.Metrics, error) {
	var m vegeta.Metrics
	dec := vegeta.NewDecoder(r)
	for {
		var res vegeta.Result
		if err := dec.Decode(&res); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return m, err
		}
		m.Add(&res)
	}
	m.Close()
	return m, nil
}

// vegetaLatencies is the latency line of `vegeta report` (nanoseconds).
type vegetaLatencies struct {
	MinNs  int64 `json:"min_ns"`
	MeanNs int64 `json:"mean_ns"`
	P50Ns  int64 `json:"p50_ns"`
	P90Ns  int64 `json:"p90_ns"`
	P95Ns  int64 `json:"p95_ns"`
	P99Ns  int64 `json:"p99_ns"`
	MaxNs  int64 `json:"max_ns"`
}

func vegetaLatency(m *vegeta.Metrics) vegetaLatencies {
	l := m.Latencies
	return vegetaLatencies{MinNs: int64(l.Min), MeanNs: int64(l.Mean), P50Ns: int64(l.P50), P90Ns: int64(l.P90),
		P95Ns: int64(l.P95), P99Ns: int64(l.P99), MaxNs: int64(l.Max)}
}

func fmtVegetaLatency(l vegetaLatencies) string {
	return fmt.Sprintf("min %s  mean %s  p50 %s  p90 %s  p95 %s  p99 %s  max %s",
		fmtNs(l.MinNs), fmtNs(l.MeanNs), fmtNs(l.P50Ns), fmtNs(l.P90Ns), fmtNs(l.P95Ns), fmtNs(l.P99Ns), fmtNs(l.MaxNs))
}

// durationOf is vegeta's attack duration (first to last request sent).
func durationOf(m *vegeta.Metrics) time.Duration { return m.Duration }
