package config

import (
	"net/url"

	"github.com/slidegate/slidegate/engine"
)

// StoreScheme names a store URL by its scheme ("memory", "redis://").
func StoreScheme(store string) string {
	if store == DefaultStore {
		return store
	}
	u, err := url.Parse(store)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Scheme + "://"
}

// KeyCap is the memory store's key cap for pc, max_keys or DefaultMaxKeys
// when unset, and what a new key gets at it.
func (pc PolicyConfig) KeyCap() (int, engine.Overflow) {
	n := int(pc.MaxKeys)
	if n == 0 {
		n = DefaultMaxKeys
	}
	o, _ := engine.ParseOverflow(pc.Overflow) // Validate has checked
	return n, o
}

// WithKeyCap is pc with the memory store's key cap written out, as it
// runs: two policies that run the same compare equal.
func (pc PolicyConfig) WithKeyCap() PolicyConfig {
	n, o := pc.KeyCap()
	pc.MaxKeys, pc.Overflow = Int(n), o.String()
	return pc
}
