package shard_test

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/shard"
)

// shortKeys returns keys of every length up to 3*ShortKeyBytes+3 that
// differ from one another in one byte, or only in a trailing zero byte
// (the index pads a short key's words with zeros, so "ab" and "ab\x00"
// have the same words and differ in length only). The longer ones reach
// every word a lookup compares past a key's first two, and the last one,
// which overlaps the word before it.
func shortKeys() []string {
	var keys []string
	seen := map[string]bool{}
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for n := range 3*shard.ShortKeyBytes + 4 {
		base := []byte(strings.Repeat("k", n))
		add(string(base))
		add(string(base) + "\x00")
		for i := range n {
			for _, c := range []byte{0x00, 'j', 'l', 0x80, 0xff} {
				k := append([]byte(nil), base...)
				k[i] = c
				add(string(k))
			}
		}
	}
	return keys
}

// TestShortWords checks the index's words of a short key against the
// key's bytes: little-endian, zero past the end.
func TestShortWords(t *testing.T) {
	for _, k := range shortKeys() {
		if len(k) > shard.ShortKeyBytes {
			continue
		}
		var buf [16]byte
		copy(buf[:], k)
		w0, w1 := shard.ShortWords(strings.Clone(k))
		if want0, want1 := binary.LittleEndian.Uint64(buf[:8]), binary.LittleEndian.Uint64(buf[8:]); w0 != want0 || w1 != want1 {
			t.Fatalf("key %q: words %#x %#x, want %#x %#x", k, w0, w1, want0, want1)
		}
	}
}

// TestShortKeysAreDistinct decides keys that differ in one byte at every
// position of every length up to three times the inline hash's, or in a
// trailing zero byte: each key is its own state (its first request of a
// limit of 1 is allowed), and a fresh copy of each finds it again (its
// second is refused).
func TestShortKeysAreDistinct(t *testing.T) {
	for _, shards := range []int{1, 64} {
		s := newStore(t, shard.Config{Limit: 1, Window: int64(time.Hour), Shards: shards})
		keys := shortKeys()
		var r shard.Result
		for i, k := range keys {
			if err := s.Decide(strings.Clone(k), 1, int64(i), true, &r); err != nil || !r.Allowed {
				t.Fatalf("shards %d: first request of %q: allowed %v, error %v; another key's state?", shards, k, r.Allowed, err)
			}
		}
		for i, k := range keys {
			if err := s.Decide(strings.Clone(k), 1, int64(len(keys)+i), true, &r); err != nil || r.Allowed {
				t.Fatalf("shards %d: second request of %q: allowed %v, error %v; its state not found", shards, k, r.Allowed, err)
			}
		}
		if got := s.Stats().Keys; got != len(keys) {
			t.Fatalf("shards %d: %d keys held, want %d", shards, got, len(keys))
		}
	}
}

// TestHoldsShort compares every pair of short keys the way a lookup does
// once a tag matched: a block matches the key it holds and no other.
func TestHoldsShort(t *testing.T) {
	var keys []string
	for _, k := range shortKeys() {
		if len(k) <= shard.ShortKeyBytes {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		for _, o := range keys {
			if got := shard.BlockHoldsShort(strings.Clone(k), strings.Clone(o)); got != (k == o) {
				t.Fatalf("block of %q matches %q: %v", k, o, got)
			}
		}
	}
}
