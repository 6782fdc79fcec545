package connlimit

// The counts tests wait on. They are here, not on Listener, because only
// tests read them: each takes the listener's lock.

// Open returns the connections open now (admitted and not closed).
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Idle returns the connections idle now (between requests).
func (l *Listener) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i, c := range l.slots.conns {
		if c != nil && idleWord(l.slots.word(i).Load(), c.gen) {
			n++
		}
	}
	return n
}

// Waiting returns the connections waiting for their address's slot.
func (l *Listener) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}
