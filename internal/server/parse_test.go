package server

import (
	"encoding/json"
	"testing"
	"unsafe"
)

// TestParseAllowFastAgreesWithJSON: whatever the fast path accepts,
// encoding/json (the fallback, strict) decodes to the same request.
func TestParseAllowFastAgreesWithJSON(t *testing.T) {
	for _, in := range []string{
		`{"key":"a"}`, ` { "key" : "a" , "policy":"free","cost":3 } `, `{}`, `{"cost":-2,"key":"x"}`,
		`{"key":"a","key":"b"}`, `{"cost":0}`, `{"cost":123456789}`,
		// Rejected by the fast path (the fallback decides):
		`{"key":"a\n"}`, `{"key":"\u00e9"}`, `{"key":"é"}`, `{"cost":1.5}`, `{"cost":1e3}`, `{"cost":01}`,
		`{"cost":1234567890}`, `{"key":null}`, `{"key":"a"}x`, `{"key":"a",}`, `{"kex":"a"}`, `[]`, ``, `{"key":"a"`,
		`{"key" "a"}`, `{"cost":-}`, `{"policy":7}`,
		// Names close to the three (the fast path matches each whole):
		`{"k":"a"}`, `{"ke":"a"}`, `{"keyy":"a"}`, `{"Key":"a"}`, `{"policyx":"a"}`, `{"cos":1}`, `{"costs":1}`,
		`{"k\u0065y":"a"}`, `{"`, `{"ke`, `{"key`, `{"key"`, `{"cost"`, "{\"key\":\"a\x7f\"}", "{\"key\":\"\x7f\x20~\"}",
	} {
		var fast AllowRequest
		var cost int
		_, ok, hasCost := parseAllowFast([]byte(in), nil, &fast, &cost)
		if hasCost {
			fast.Cost = &cost
		}
		var slow AllowRequest
		err := decodeAllow([]byte(in), &slow)
		if !ok {
			continue
		}
		if err != nil {
			t.Errorf("%q: fast path accepted, encoding/json says %v", in, err)
			continue
		}
		fj, _ := json.Marshal(fast)
		sj, _ := json.Marshal(slow)
		if string(fj) != string(sj) {
			t.Errorf("%q: fast %s, encoding/json %s", in, fj, sj)
		}
	}
}

// TestParseAllowFastKnownPolicy: a policy the server knows is given its
// tier's name (no new string); another is copied out of the body, which
// the server reuses for the next request. The key is a view of the body
// (handleAllow copies it for backends that keep keys: TestBorrowedKeys).
func TestParseAllowFastKnownPolicy(t *testing.T) {
	known := map[string]*policy{"free": {name: "free"}}
	body := []byte(`{"key":"a","policy":"free"}`)
	var req AllowRequest
	cost := 1
	if got, ok, hasCost := parseAllowFast(body, known, &req, &cost); !ok || hasCost || cost != 1 || got != known["free"] {
		t.Fatalf("policy %p, ok %v, hasCost %v, cost %d", got, ok, hasCost, cost)
	}
	if req.Policy != "free" || unsafe.StringData(req.Policy) != unsafe.StringData(known["free"].name) {
		t.Errorf("policy %q is not the tier's name", req.Policy)
	}
	body = []byte(`{"key":"a","policy":"gold"}`)
	if got, ok, _ := parseAllowFast(body, known, &req, &cost); !ok || req.Policy != "gold" || got != nil {
		t.Fatalf("ok %v, policy %q (%p)", ok, req.Policy, got)
	}
	copy(body, `{"key":"b","policy":"xxxx"}`)
	if req.Policy != "gold" {
		t.Errorf("policy %q changed with the body's bytes", req.Policy)
	}
	if req.Key != "b" {
		t.Errorf("key %q is a copy, not a view of the body", req.Key)
	}
}

func FuzzParseAllowFast(f *testing.F) {
	f.Add(`{"key":"a","policy":"free","cost":3}`)
	f.Add(`{"cost":-0}`)
	f.Fuzz(func(t *testing.T, in string) {
		var fast AllowRequest
		var cost int
		_, ok, hasCost := parseAllowFast([]byte(in), nil, &fast, &cost)
		if !ok {
			return
		}
		if hasCost {
			fast.Cost = &cost
		}
		var slow AllowRequest
		if err := decodeAllow([]byte(in), &slow); err != nil {
			t.Fatalf("%q: fast path accepted, encoding/json says %v", in, err)
		}
		fj, _ := json.Marshal(fast)
		sj, _ := json.Marshal(slow)
		if string(fj) != string(sj) {
			t.Fatalf("%q: fast %s, encoding/json %s", in, fj, sj)
		}
	})
}

// TestParseAllowFastAccepts: the shapes clients send take the fast path,
// field by field, in any order and with white space.
func TestParseAllowFastAccepts(t *testing.T) {
	for _, c := range []struct {
		in          string
		key, policy string
		cost        int
	}{
		{`{"key":"lt-client-734519","policy":"free","cost":1}`, "lt-client-734519", "free", 1},
		{` { "cost" : 3 ,"policy": "pro" , "key":"a b~" } `, "a b~", "pro", 3},
		{"{\"key\":\"\x7f!\"}", "\x7f!", "", 0},
		{`{"policy":"gold","cost":-2}`, "", "gold", -2},
	} {
		var req AllowRequest
		cost := 0
		if _, ok, _ := parseAllowFast([]byte(c.in), nil, &req, &cost); !ok || req.Key != c.key || req.Policy != c.policy || cost != c.cost {
			t.Errorf("%q: ok %v, key %q, policy %q, cost %d", c.in, ok, req.Key, req.Policy, cost)
		}
	}
}
