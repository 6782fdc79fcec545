package shard

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"unsafe"
)

// keyHasher hashes the keys of a store without HashedKeys (see keyOf).
// A key of up to shortKeyBytes is hashed here: its bytes are read as
// two words (shortWords) and mixed with two secret words by two 128-bit
// multiplies. This is the construction Go's runtime hashes map keys with
// where the CPU has no AES instructions (runtime.memhashFallback, after
// wyhash). The index compares the same words (block.holdsShort), so a
// lookup of a short key calls neither maphash nor the runtime's memory
// comparison (docs/design.md, "A short key is compared as two words"). A
// longer key is hashed by maphash.String under seed. The secret words
// and the seed are drawn at random per store and never shown, so a
// client cannot aim its keys at one shard or bucket.
type keyHasher struct {
	k0, k1 uint64
	seed   maphash.Seed
}

// shortKeyBytes is the longest key keyHasher hashes inline.
const shortKeyBytes = 16

// m5 is the constant the runtime's fallback hash mixes the length with.
const m5 = 0x1d8e4e27c47d124f

func newKeyHasher(seed maphash.Seed) keyHasher {
	// The secret words come from the seed's own hash, as random as it.
	return keyHasher{
		k0:   maphash.String(seed, "slidegate k0") | 1,
		k1:   maphash.String(seed, "slidegate k1") | 1,
		seed: seed,
	}
}

// hash returns key's hash.
func (kh *keyHasher) hash(key string) uint64 {
	if len(key) > shortKeyBytes {
		return maphash.String(kh.seed, key)
	}
	w0, w1 := shortWords(key)
	return kh.short(len(key), w0, w1)
}

// short is the hash of the key of n bytes (n ≤ shortKeyBytes) whose words
// (shortWords) are w0 and w1. The words and n determine the key.
func (kh *keyHasher) short(n int, w0, w1 uint64) uint64 {
	return mix(m5^uint64(n), mix(w0^kh.k1, w1^kh.k0))
}

// shortWords returns a key of up to shortKeyBytes as two little-endian
// words, zero past its end: the words its linked block holds (newBlock),
// so that a lookup compares them instead of calling the runtime's memory
// comparison. Every load is within the key's bytes: a key of 8 bytes or
// more is read as its first and its last 8 (which overlap below 16), a
// key of 4 to 7 as its first and its last 4, a shorter one byte by byte.
// The shifts are masked to 63, so that the compiler emits no check for
// larger ones: none is larger.
func shortWords(key string) (w0, w1 uint64) {
	n := len(key)
	p := unsafe.Pointer(unsafe.StringData(key))
	switch {
	case n > 8:
		w0 = le64(p, 0)
		w1 = le64(p, n-8) >> ((128 - 8*n) & 63)
	case n == 8:
		w0 = le64(p, 0)
	case n >= 4:
		w0 = uint64(le32(p, 0)) | uint64(le32(p, n-4))<<((8*n-32)&63)
	case n > 0:
		w0 = uint64(*(*byte)(p)) | uint64(*(*byte)(unsafe.Add(p, n>>1)))<<((8*(n>>1))&63) |
			uint64(*(*byte)(unsafe.Add(p, n-1)))<<((8*n-8)&63)
	}
	return w0, w1
}

// probeWords returns shortWords of a key of up to shortKeyBytes, and the
// first two words of a longer one, which its block holds first.
func probeWords(key string) (w0, w1 uint64) {
	if len(key) <= shortKeyBytes {
		return shortWords(key)
	}
	p := unsafe.Pointer(unsafe.StringData(key))
	return le64(p, 0), le64(p, 8)
}

// le64 is the little-endian word at byte off of p.
func le64(p unsafe.Pointer, off int) uint64 {
	return binary.LittleEndian.Uint64((*[8]byte)(unsafe.Add(p, off))[:])
}

// le32 is the little-endian 32-bit word at byte off of p.
func le32(p unsafe.Pointer, off int) uint32 {
	return binary.LittleEndian.Uint32((*[4]byte)(unsafe.Add(p, off))[:])
}

// mix folds the 128-bit product of a and b into 64 bits.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}
