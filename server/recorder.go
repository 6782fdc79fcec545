package server

import (
	"sync"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// Record is one decision the server made, for offline verification.
type Record struct {
	Policy   string
	Key      string
	Cost     int
	Decision engine.Decision
}

// Reference converts r to the record the reference verifier replays
// (reference.VerifyLog and VerifyCounter).
func (r Record) Reference() reference.Record {
	return reference.Record{
		Key:        r.Key,
		Cost:       r.Cost,
		At:         r.Decision.At,
		Allowed:    r.Decision.Allowed,
		Remaining:  r.Decision.Remaining,
		RetryAfter: int64(r.Decision.RetryAfter),
		Reset:      int64(r.Decision.Reset),
	}
}

// Recorder receives every decision the server makes (decision API, batch
// and gateway), on the request's goroutine, so it must be safe for
// concurrent use and quick. It exists for tests and load tests that verify
// decisions offline; a production server runs without one.
type Recorder interface {
	Record(Record)
}

// MemoryRecorder keeps records in memory, behind a mutex. The zero value
// is ready to use.
type MemoryRecorder struct {
	mu   sync.Mutex
	recs []Record
}

// NewMemoryRecorder returns an empty recorder with room for n records.
func NewMemoryRecorder(n int) *MemoryRecorder {
	return &MemoryRecorder{recs: make([]Record, 0, max(n, 0))}
}

// Record appends r.
func (m *MemoryRecorder) Record(r Record) {
	m.mu.Lock()
	m.recs = append(m.recs, r)
	m.mu.Unlock()
}

// Len returns the number of records.
func (m *MemoryRecorder) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs)
}

// Records returns a copy of the records, in arrival order.
func (m *MemoryRecorder) Records() []Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Record(nil), m.recs...)
}

// Reference returns the records of one policy converted for the reference
// verifier.
func (m *MemoryRecorder) Reference(policy string) []reference.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []reference.Record
	for _, r := range m.recs {
		if r.Policy == policy {
			out = append(out, r.Reference())
		}
	}
	return out
}

// Reset drops every record.
func (m *MemoryRecorder) Reset() {
	m.mu.Lock()
	m.recs = m.recs[:0]
	m.mu.Unlock()
}
