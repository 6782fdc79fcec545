package engine

import (
	"fmt"
	"slices"
	"strings"
)

// names are the names configuration files use for the values of an
// enumeration (Algorithm, Overflow): one table serves both String and
// Parse.
type names[T ~int] struct {
	typ     string       // T's name, for a value without one: "Algorithm(7)"
	of      []string     // of[v] is value v's name
	aliases map[string]T // other spellings parse accepts, "" included
}

// name returns v's name.
func (n names[T]) name(v T) string {
	if v >= 0 && int(v) < len(n.of) {
		return n.of[v]
	}
	return fmt.Sprintf("%s(%d)", n.typ, int(v))
}

// parse returns the value s names, ignoring case and surrounding space,
// and false for none.
func (n names[T]) parse(s string) (T, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	if i := slices.Index(n.of, s); i >= 0 {
		return T(i), true
	}
	v, ok := n.aliases[s]
	return v, ok
}
