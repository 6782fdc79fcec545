package redisstore

import (
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Redis Cluster places a key by the CRC16 of its hash tag (the text between
// the first "{" and the next "}") modulo 16384. If client keys chose the
// tag, anyone who picks their own key (an API key header in gateway mode)
// could put all their keys in one slot, and so all their load on one
// master: keys shaped "tenant}N" or "a{b}N" all share one tag.
//
// So the tag is derived from a hash instead: the slot of a client key is
// xxhash64(tag source) mod 16384, where the tag source is the client key
// (or, for keys that must share a slot, a tag the caller names: see
// Limiter.DecideTagged), and the Redis key carries the shortest string
// whose CRC16 is that slot, three characters of [0-9A-Za-z_-] (slotTags).
// Distinct keys then spread over the slots as xxhash spreads them, however
// they are chosen; the client key still follows the tag in full, so two
// clients whose hashes collide still have two Redis keys.

// numSlots is the number of Redis Cluster hash slots.
const numSlots = 16384

// slotOf returns the cluster slot a tag source maps to.
func slotOf(src string) int { return int(xxhash.Sum64String(src) % numSlots) }

var (
	slotTagsOnce sync.Once
	slotTagTable [numSlots]string
)

// slotTags returns, per slot, a short string whose CRC16 mod 16384 is that
// slot, built once (a few milliseconds: 262,144 CRC16s of three bytes).
func slotTags() *[numSlots]string {
	slotTagsOnce.Do(func() {
		const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-"
		left := numSlots
		var b [4]byte
		for n := 1; left > 0 && n <= 4; n++ {
			total := 1
			for range n {
				total *= len(alphabet)
			}
			for i := range total {
				x := i
				for j := range n {
					b[j] = alphabet[x%len(alphabet)]
					x /= len(alphabet)
				}
				s := crc16(b[:n]) % numSlots
				if slotTagTable[s] == "" {
					slotTagTable[s] = string(b[:n])
					left--
				}
			}
		}
		if left > 0 {
			panic("redisstore: slot tags do not cover every slot") // cannot happen: checked by TestSlotTags
		}
	})
	return &slotTagTable
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), Redis Cluster's
// key hash.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
