package httpkit

import "github.com/slidegate/slidegate/engine"

// KeyBorrower is implemented by a backend that wraps another and keeps
// nothing of the key strings its Decide is handed once Decide returns
// (whatever it keeps, it copies), when BorrowsKey reports true; see
// BorrowsKey.
type KeyBorrower interface {
	engine.Backend
	BorrowsKey() bool
}

// BorrowsKey reports whether b keeps nothing of the key string Decide is
// handed once Decide returns, so that a caller may hand it a view of a
// buffer it reuses afterwards (the decision API hands it the key's bytes
// in the request body's pooled buffer instead of a copy, one allocation
// per request).
//
// *engine.Limiter does: its store hashes and compares the key, copies its
// bytes into the key's block when the key is new or its block grows (the
// map's key is that copy), and keeps only a hash with WithHashedKeys; its
// overflow and refusal paths and its errors (cost, instant) do not hold
// the key. Any other backend is assumed to keep it (a Redis client may
// still hold a command's arguments after a cancelled call returns), unless
// it is a KeyBorrower that says otherwise.
func BorrowsKey(b engine.Backend) bool {
	switch b := b.(type) {
	case *engine.Limiter:
		return true
	case KeyBorrower:
		return b.BorrowsKey()
	}
	return false
}
