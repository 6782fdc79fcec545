package server

import (
	"sync"

	"github.com/slidegate/slidegate/engine"
)

// Record is one decision the server made, for offline verification: its
// fields are what the reference verifier (internal/reference) replays,
// Decision.At giving the order.
type Record struct {
	Policy   string
	Key      string
	Cost     int
	Decision engine.Decision
	// Limits is set for a request decided over several limits at once (a
	// route's list, a decision API request naming several limits): each
	// limit's policy, key and decision, in the request's order; Policy,
	// Key and Decision are then the binding limit's. The request was
	// allowed iff every limit's Decision.Allowed is true, and then it
	// counted against every limit.
	Limits []RecordLimit
}

// RecordLimit is one limit's part of a multi-limit Record.
type RecordLimit struct {
	Policy   string
	Key      string
	Decision engine.Decision
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

// Reset drops every record.
func (m *MemoryRecorder) Reset() {
	m.mu.Lock()
	m.recs = m.recs[:0]
	m.mu.Unlock()
}
