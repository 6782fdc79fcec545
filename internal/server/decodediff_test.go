package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// decodeSeeds are bodies of every kind the decoders tell apart: what the
// fast path takes, what only the fallback takes, and what both refuse.
var decodeSeeds = []string{
	`{"key":"a"}`, ` { "key" : "a" , "policy":"free","cost":3 } `, `{}`, `{"cost":-2,"key":"x"}`,
	`{"key":"a","key":"b"}`, `{"cost":0}`, `{"cost":123456789}`, `{"policy":"free","policy":"gold"}`,
	`{"policy":"gold","policy":"free"}`, `{"policy":""}`, `{"cost":-0}`, `{"cost":null}`,
	`{"key":"a\n"}`, `{"key":"\u00e9"}`, `{"key":"é"}`, `{"cost":1.5}`, `{"cost":1e3}`, `{"cost":01}`,
	`{"cost":1234567890}`, `{"cost":-}`, `{"key":null}`, `{"key":"a"}x`, `{"key":"a",}`, `{"kex":"a"}`,
	`{"Key":"a"}`, `{"KEY":"a"}`, `[]`, ``, `null`, `{"key":"a"`, `{"key" "a"}`, `{"policy":7}`,
	`{"key":"a","tag":"t"}`, `{"limits":[{"policy":"free","key":"a"}],"tag":"t"}`, `{"limits":null}`,
	`{"limits":[{"policy":"free","key":"a","x":1}]}`, "{\"key\":\"\xff\"}", `{"key":"\ud800"}`,
}

// FuzzAllowDecoders is a differential test of the decision API's body
// decoding. decodeAllowBody (the fast path, else the strict decoder) must
// agree exactly with decodeAllow alone: the same requests accepted, the
// same decoded request and cost, and for a refusal the same error, which
// is the 400's problem detail. And whatever it accepts, encoding/json
// with DisallowUnknownFields (the server's first decoder) accepts too and
// decodes the same: the strict decoder may refuse more (field names in
// another case, invalid UTF-8, a null body), never less.
func FuzzAllowDecoders(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add(s)
	}
	known := map[string]*policy{"free": {name: "free"}}
	f.Fuzz(func(t *testing.T, in string) {
		b := []byte(in)
		var got AllowRequest
		cost, kn, _, err := decodeAllowBody(b, known, &got)
		var want AllowRequest
		werr := decodeAllow(b, &want)
		if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
			t.Fatalf("%q: decodeAllowBody error %v, decodeAllow error %v", in, err, werr)
		}
		if err != nil {
			return
		}
		wantCost := 1
		if want.Cost != nil {
			wantCost = *want.Cost
		}
		got.Cost = want.Cost // the fast path gives its cost apart
		if !reflect.DeepEqual(got, want) || cost != wantCost {
			t.Fatalf("%q: decodeAllowBody %+v cost %d, decodeAllow %+v cost %d", in, got, cost, want, wantCost)
		}
		if kn != nil && (kn != known[got.Policy] || got.Policy == "") {
			t.Fatalf("%q: known policy %q for policy %q", in, kn.name, got.Policy)
		}
		var orig AllowRequest
		if err := decodeDisallowUnknown(b, &orig); err != nil {
			t.Fatalf("%q: accepted, but encoding/json with DisallowUnknownFields says %v", in, err)
		}
		if !reflect.DeepEqual(orig, want) {
			t.Fatalf("%q: decoded %+v, encoding/json with DisallowUnknownFields %+v", in, want, orig)
		}
	})
}

// decodeDisallowUnknown is the server's first decoder, encoding/json
// with DisallowUnknownFields and nothing after the value, with the rule
// the server added since: valid UTF-8 only (encoding/json would replace
// invalid bytes, so that different keys compare equal).
func decodeDisallowUnknown(data []byte, v any) error {
	if !utf8.Valid(data) {
		return errNotUTF8
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the value")
	}
	return nil
}

// TestDecodeNamesFirstError: a body with several faults gets the same
// problem detail every time, about the first field at fault in the body
// (decoding into a map named a random one).
func TestDecodeNamesFirstError(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"zz":1,"aa":2,"mm":3}`, `unknown field "zz"`},
		{`{"key":"a","cost":"x","policy":7}`, `"cost" must be a whole number`},
		{`{"policy":7,"key":"a","cost":"x"}`, `"policy" must be a string`},
		{`{"limits":[{"policy":"free","zz":1,"aa":2}]}`, `limits[0]: unknown field "zz"`},
		{`{"limits":[{"key":1,"policy":2}]}`, `limits[0]: "key" must be a string`},
	} {
		for range 64 {
			var req AllowRequest
			err := decodeAllow([]byte(c.in), &req)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s: error %v, want one about %s", c.in, err, c.want)
			}
		}
	}
}

// FuzzBatchDecoders: decodeBatchBody (the batch fast path, else the
// strict decoder) agrees exactly with decodeBatch alone: the same bodies
// accepted, the same items and costs, the same error.
func FuzzBatchDecoders(f *testing.F) {
	f.Add(`[{"key":"a"}]`)
	f.Add(` [ {"key":"a","policy":"free","cost":2} , {"policy":"gold","key":"b"} ] `)
	f.Add(`[{"key":"a"},]`)
	f.Add(`[]`)
	f.Add(`[{"key":"a"}]x`)
	f.Add(`[{"key":"a"} {"key":"b"}]`)
	f.Add(`[{"key":"a","zz":1},{"key":"b","aa":2}]`)
	f.Add(`[{"limits":[{"policy":"free","key":"a"}]},{"key":"b"}]`)
	f.Add(`[{"cost":01}]`)
	f.Add(`{"key":"a"}`)
	known := map[string]*policy{"free": {name: "free"}}
	f.Fuzz(func(t *testing.T, in string) {
		b := []byte(in)
		items, _, err := decodeBatchBody(b, known)
		reqs, werr := decodeBatch(b)
		if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
			t.Fatalf("%q: decodeBatchBody error %v, decodeBatch error %v", in, err, werr)
		}
		if err != nil {
			return
		}
		if len(items) != len(reqs) {
			t.Fatalf("%q: %d items, decodeBatch %d", in, len(items), len(reqs))
		}
		for i, it := range items {
			want := reqs[i]
			wantCost := 1
			if want.Cost != nil {
				wantCost = *want.Cost
			}
			got := it.req
			got.Cost = want.Cost // the fast path gives its cost apart
			if !reflect.DeepEqual(got, want) || it.cost != wantCost {
				t.Fatalf("%q: item %d: %+v cost %d, decodeBatch %+v cost %d", in, i, got, it.cost, want, wantCost)
			}
			if it.known != nil && it.known != known[got.Policy] {
				t.Fatalf("%q: item %d: known policy %q for policy %q", in, i, it.known.name, got.Policy)
			}
		}
	})
}
