package loadtest

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/reference"
)

// record is one decision as the harness keeps it: 40 bytes, with the key as
// a client index and the policy as an index into the run's policies, so
// that millions of decisions fit in memory (a reference.record with its key
// string takes 64 bytes plus the key). Durations are nanoseconds.
type record struct {
	At         int64
	RetryAfter int64
	Reset      int64
	Key        uint32 // client index (see clientKey), or an interned key
	Cost       uint32
	Remaining  int32
	Policy     uint8
	Allowed    bool
}

// makeRecord packs a decision.
func makeRecord(policy uint8, key uint32, cost int, d engine.Decision) record {
	return record{
		At:         d.At,
		RetryAfter: int64(d.RetryAfter),
		Reset:      int64(d.Reset),
		Key:        key,
		Cost:       uint32(cost),
		Remaining:  int32(d.Remaining),
		Policy:     policy,
		Allowed:    d.Allowed,
	}
}

// errRecordLimit is returned when a run makes more decisions than it may
// record.
var errRecordLimit = errors.New("loadtest: record limit reached")

// recorder collects the decisions of a server under test, from many
// goroutines, into at most max records. Keys made by clientKey are stored
// as their index; other keys are interned. It is safe for concurrent use.
//
// A decision takes no lock: it reserves its record's slot with one atomic
// add, writes the record into a fixed chunk of recordChunk records (the
// first decision to reach a chunk allocates it), and counts it written.
// The lock (mu) is only for what the timed phases do not send: keys not
// made by clientKey, and unknown policies.
type recorder struct {
	policies map[string]uint8
	clients  int
	max      int

	chunks  []atomic.Pointer[[recordChunk]record]
	next    atomic.Int64 // slots reserved; those from max on are dropped
	written atomic.Int64 // records written

	mu       sync.Mutex
	unknown  map[string]uint32 // interned keys not made by clientKey
	names    []string          // their names, by index - clients
	badNames map[string]int64  // decisions under a policy the run does not know
}

// newRecorder returns a recorder for decisions under the named policies
// (their order gives record.Policy) over clients keys, keeping at most max
// records.
func newRecorder(policies []string, clients int, max int) *recorder {
	r := &recorder{policies: map[string]uint8{}, clients: clients, max: max, unknown: map[string]uint32{},
		chunks: make([]atomic.Pointer[[recordChunk]record], (max+recordChunk-1)/recordChunk)}
	for i, p := range policies {
		r.policies[p] = uint8(i)
	}
	return r
}

// policyIndex is the index of the named policy in the recorder's
// records, and whether the run knows it.
func (r *recorder) policyIndex(policy string) (uint8, bool) {
	p, ok := r.policies[policy]
	return p, ok
}

// Add records a decision of cost under the named policy for key.
func (r *recorder) Add(policy, key string, cost int, d engine.Decision) {
	p, ok := r.policyIndex(policy)
	if !ok {
		r.mu.Lock()
		if r.badNames == nil {
			r.badNames = map[string]int64{}
		}
		r.badNames[policy]++
		r.mu.Unlock()
		return
	}
	r.AddIndex(p, key, cost, d)
}

// AddIndex records a decision of cost for key under the policy of index
// p (policyIndex).
func (r *recorder) AddIndex(p uint8, key string, cost int, d engine.Decision) {
	i := r.next.Add(1) - 1
	if i >= int64(r.max) {
		return // dropped: Records reports it
	}
	idx, ok := clientIndex(key)
	if !ok || idx >= r.clients {
		idx = r.intern(key)
	}
	c := &r.chunks[i/recordChunk]
	chunk := c.Load()
	if chunk == nil {
		chunk = new([recordChunk]record)
		if !c.CompareAndSwap(nil, chunk) {
			chunk = c.Load()
		}
	}
	chunk[i%recordChunk] = makeRecord(p, uint32(idx), cost, d)
	r.written.Add(1)
}

// intern returns the index of a key not made by clientKey.
func (r *recorder) intern(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, seen := r.unknown[key]
	if !seen {
		// A copy: key may be a view of a request buffer the server
		// reuses (recordingBackend.BorrowsKey).
		key = strings.Clone(key)
		k = uint32(r.clients + len(r.names))
		r.unknown[key] = k
		r.names = append(r.names, key)
	}
	return int(k)
}

// recordChunk is how many records a recorder allocates at a time (640
// KiB).
const recordChunk = 16 << 10

// Records returns what was recorded, and an error when decisions were lost
// (over the limit, or under an unknown policy): a verification of an
// incomplete log would be meaningless. It is called once the decisions
// are made: it waits for those whose slot is reserved to be written.
func (r *recorder) Records() ([]record, error) {
	reserved := r.next.Load()
	n := min(reserved, int64(r.max))
	for r.written.Load() < n {
		runtime.Gosched()
	}
	recs := make([]record, n)
	for i := int64(0); i < n; i += recordChunk {
		copy(recs[i:], r.chunks[i/recordChunk].Load()[:min(recordChunk, n-i)])
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if reserved > n {
		return recs, fmt.Errorf("%w: %d decisions beyond %d were not recorded", errRecordLimit, reserved-n, r.max)
	}
	for name, n := range r.badNames {
		return recs, fmt.Errorf("loadtest: %d decisions under unknown policy %q", n, name)
	}
	return recs, nil
}

// keyName returns the key string of index i.
func (r *recorder) keyName(i uint32) string {
	if int(i) >= r.clients {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.names[int(i)-r.clients]
	}
	return clientKey(int(i))
}

// verification is what the offline replay found.
type verification struct {
	// Verified is false when the run could not be verified (Reason says
	// why, e.g. an external target whose decisions are not visible).
	Verified bool `json:"verified"`
	// Approximate is set when some policy is the sliding window counter:
	// its decisions are replayed through reference.VerifyCounter, which
	// does not count over- and under-admissions (the counter errs both
	// ways by design).
	Approximate     bool     `json:"approximate,omitempty"`
	Reason          string   `json:"reason,omitempty"`
	Records         int      `json:"records"`
	Allowed         int      `json:"allowed"`
	Refused         int      `json:"refused"`
	Mismatches      int      `json:"mismatches"`
	OverAdmissions  int      `json:"over_admissions"`
	UnderAdmissions int      `json:"under_admissions"`
	Examples        []string `json:"examples,omitempty"`
}

// OK reports whether the run was verified and nothing was found.
func (v verification) OK() bool {
	return v.Verified && v.Mismatches == 0 && v.OverAdmissions == 0 && v.UnderAdmissions == 0
}

func (v *verification) add(r reference.Report) {
	v.Records += r.Decisions
	v.Allowed += r.Allowed
	v.Refused += r.Refused
	v.Mismatches += r.Mismatches
	v.OverAdmissions += r.OverAdmissions
	v.UnderAdmissions += r.UnderAdmissions
	for _, e := range r.Examples {
		if len(v.Examples) < 10 {
			v.Examples = append(v.Examples, e)
		}
	}
}

// verifyBuckets is how many groups of keys are replayed independently; each
// group is converted to reference.Records on its own, so the verifier's
// extra memory is about 1/verifyBuckets of a full conversion per goroutine.
const verifyBuckets = 64

// verify replays recs offline through the reference model of each policy
// (reference.VerifyLog for the exact log, reference.VerifyCounter for the
// counter) and adds up what it finds. Keys are split into groups replayed
// in parallel: a key's decisions depend on that key's alone. keyName maps
// record.Key back to the key string (examples quote it).
func verify(policies []engine.Policy, recs []record, keyName func(uint32) string) verification {
	return verifyProgress(policies, recs, keyName, nil)
}

// verifyProgress is Verify, counting replayed key groups (of
// verifyBuckets) in done when it is not nil.
func verifyProgress(policies []engine.Policy, recs []record, keyName func(uint32) string, done *atomic.Int64) verification {
	v := verification{Verified: true}
	for _, p := range policies {
		v.Approximate = v.Approximate || p.Algorithm == engine.SlidingCounter
	}
	// Counting sort of record indices by bucket (key mod verifyBuckets).
	var counts [verifyBuckets + 1]int
	for i := range recs {
		counts[recs[i].Key%verifyBuckets+1]++
	}
	for b := 1; b <= verifyBuckets; b++ {
		counts[b] += counts[b-1]
	}
	order := make([]uint32, len(recs))
	next := counts
	for i := range recs {
		b := recs[i].Key % verifyBuckets
		order[next[b]] = uint32(i)
		next[b]++
	}

	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		work = make(chan int)
	)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				idx := order[counts[b]:counts[b+1]]
				for p, pol := range policies {
					var rr []reference.Record
					for _, i := range idx {
						r := &recs[i]
						if int(r.Policy) != p {
							continue
						}
						// A record with a cost outside 1..limit is a
						// mismatch; reference.Verify* count it as one.
						rr = append(rr, reference.Record{
							Key: keyName(r.Key), Cost: int(r.Cost), At: r.At, Allowed: r.Allowed,
							Remaining: int(r.Remaining), RetryAfter: r.RetryAfter, Reset: r.Reset,
						})
					}
					if len(rr) == 0 {
						continue
					}
					var rep reference.Report
					if pol.Algorithm == engine.SlidingCounter {
						rep = reference.VerifyCounter(pol.Limit, int64(pol.Window), rr)
					} else {
						rep = reference.VerifyLog(pol.Limit, int64(pol.Window), rr)
					}
					mu.Lock()
					v.add(rep)
					mu.Unlock()
				}
				if done != nil {
					done.Add(1)
				}
			}
		}()
	}
	for b := range verifyBuckets {
		work <- b
	}
	close(work)
	wg.Wait()
	// Records under a policy index the run does not have are not replayed:
	// count them as mismatches so that they cannot pass unseen.
	for i := range recs {
		if int(recs[i].Policy) >= len(policies) {
			v.Mismatches++
		}
	}
	return v
}
