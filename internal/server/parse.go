package server

import "unsafe"

// parseAllowFast parses the common shape of an allow request, a flat
// object of plain ASCII strings and a small integer, without reflection:
// the decision API's hot path. It reports ok=false for anything else
// (escapes, non-ASCII, floats, null, unknown or malformed fields, trailing
// data); the caller then decodes with encoding/json, which accepts what is
// valid and words the error for what is not. Both paths give the same
// AllowRequest for every input the fast path accepts (like encoding/json,
// a repeated field takes its last value), except that a cost goes to
// *cost, hasCost saying whether the body gave one, and req.Cost is left
// alone: storing a pointer to the caller's local in req would move that
// local to the heap on every request. A policy named in known gets the
// known policy's name, so that the common request allocates no policy
// string, and is returned as t (nil when the body names no policy, or one
// not in known), so that the caller need not look it up again.
//
// req.Key, when the fast path sets it, is a view of b, not a copy: it is
// valid only while b is, and the caller copies it before b is reused
// unless the key's backend keeps nothing of it (httpkit.BorrowsKey).
func parseAllowFast(b []byte, known map[string]*policy, req *AllowRequest, cost *int) (t *policy, ok, hasCost bool) {
	t, end, ok, hasCost := parseObjectFast(b, skipWS(b, 0), known, req, cost)
	if !ok || skipWS(b, end) != len(b) {
		return nil, false, false
	}
	return t, true, hasCost
}

// parseObjectFast is parseAllowFast for the object at b[i:]; end is the
// index after it.
func parseObjectFast(b []byte, i int, known map[string]*policy, req *AllowRequest, cost *int) (t *policy, end int, ok, hasCost bool) {
	if i >= len(b) || b[i] != '{' {
		return nil, 0, false, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, i + 1, true, false
	}
	for {
		// The three names, matched whole with their quotes (one compare
		// each): any other name, escaped ones included, is left to
		// encoding/json.
		var name byte
		if i+1 < len(b) {
			name = b[i+1]
		}
		switch {
		case name == 'k' && hasLit(b, i, `"key"`):
			i += len(`"key"`)
		case name == 'p' && hasLit(b, i, `"policy"`):
			i += len(`"policy"`)
		case name == 'c' && hasLit(b, i, `"cost"`):
			i += len(`"cost"`)
		default:
			return nil, 0, false, false
		}
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return nil, 0, false, false
		}
		i = skipWS(b, i+1)
		switch name {
		case 'k', 'p':
			if i >= len(b) || b[i] != '"' {
				return nil, 0, false, false
			}
			v, j, ok := plainString(b, i)
			if !ok {
				return nil, 0, false, false
			}
			if name == 'k' {
				req.Key = unsafe.String(unsafe.SliceData(v), len(v))
			} else if t = known[string(v)]; t != nil {
				req.Policy = t.name
			} else {
				req.Policy = string(v)
			}
			i = j
		default: // 'c'
			j := i
			if j < len(b) && b[j] == '-' {
				j++
			}
			start := j
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			// Up to 9 digits: no overflow, and no leading zeros (invalid
			// JSON, left to encoding/json to reject).
			if j == start || j-start > 9 || (b[start] == '0' && j-start > 1) {
				return nil, 0, false, false
			}
			n := 0
			for _, c := range b[start:j] {
				n = n*10 + int(c-'0')
			}
			if start > i {
				n = -n
			}
			*cost, hasCost = n, true
			i = j
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return nil, 0, false, false
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			return t, i + 1, true, hasCost
		default:
			return nil, 0, false, false
		}
	}
}

// batchItem is one decoded item of a batch: its request, its cost (1 when
// the body gave none) and, from the fast path, its policy when known.
type batchItem struct {
	req   AllowRequest
	cost  int
	known *policy
}

// parseBatchFast parses a batch body, a JSON array of one or more objects
// of the shape parseAllowFast takes, into items (appended to out); ok is
// false for anything else, the caller then decoding with decodeBatch.
// Keys are views of b, as with parseAllowFast.
func parseBatchFast(b []byte, known map[string]*policy, out []batchItem) ([]batchItem, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return out, false
	}
	for {
		out = append(out, batchItem{cost: 1})
		it := &out[len(out)-1]
		var ok bool
		it.known, i, ok, _ = parseObjectFast(b, skipWS(b, i+1), known, &it.req, &it.cost)
		if !ok {
			return out, false
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return out, false
		}
		switch b[i] {
		case ',':
		case ']':
			return out, skipWS(b, i+1) == len(b)
		default:
			return out, false
		}
	}
}

// hasLit reports whether b[i:] begins with lit.
func hasLit(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

func skipWS(b []byte, i int) int {
	// A byte above ' ' is not white space: one compare in the common
	// case, where there is none.
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads the JSON string starting at b[i] == '"' if it holds
// only printable ASCII without escapes; it returns its bytes and the index
// after the closing quote.
func plainString(b []byte, i int) ([]byte, int, bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c-0x20 >= 0x60: // c-0x20 wraps below 0x20
			return nil, 0, false
		}
	}
	return nil, 0, false
}
