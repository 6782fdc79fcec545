package server

import (
	"encoding/json"
	"testing"
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
	} {
		var fast AllowRequest
		var cost int
		ok := parseAllowFast([]byte(in), &fast, &cost)
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

func FuzzParseAllowFast(f *testing.F) {
	f.Add(`{"key":"a","policy":"free","cost":3}`)
	f.Add(`{"cost":-0}`)
	f.Fuzz(func(t *testing.T, in string) {
		var fast AllowRequest
		var cost int
		if !parseAllowFast([]byte(in), &fast, &cost) {
			return
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
