package server

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/headerfmt"
	"github.com/slidegate/slidegate/internal/server/config"
)

// TestAppendDecisionAsJSON: the decision API's hand-written body is
// byte for byte what encoding/json writes for the same AllowResponse,
// for numbers at every digit count and its edges (9, 10, 99, 100, …),
// 0, the largest int64, refusals and overflow.
func TestAppendDecisionAsJSON(t *testing.T) {
	nums := []int64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, math.MaxInt64, math.MaxInt64 - 1, -1, math.MinInt64}
	for p := int64(10); p <= 1e18; p *= 10 {
		nums = append(nums, p-1, p, p+1)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		nums = append(nums, rng.Int64N(math.MaxInt64)>>rng.IntN(63))
	}
	for i, n := range nums {
		m := nums[(i*7+3)%len(nums)]
		d := engine.Decision{
			Allowed:    i%3 != 0,
			Limit:      int(n),
			Remaining:  int(m),
			RetryAfter: time.Duration(m),
			Reset:      time.Duration(n),
			At:         n ^ m,
			Overflow:   i%5 == 0,
		}
		want, err := json.Marshal(AllowResponse{
			Allowed: d.Allowed, Policy: "free-1.x_y", Limit: d.Limit, Remaining: d.Remaining,
			RetryAfterNs: int64(d.RetryAfter), ResetNs: int64(d.Reset), At: d.At,
			RetryAfterSeconds: headerfmt.CeilSeconds(d.RetryAfter), ResetSeconds: headerfmt.CeilSeconds(d.Reset),
			Overflow: d.Overflow,
		})
		if err != nil {
			t.Fatal(err)
		}
		prefix := []byte("x")
		got := appendDecision(prefix[:1:1], "free-1.x_y", d)
		if string(got[1:]) != string(want) || got[0] != 'x' {
			t.Fatalf("%+v:\n got %s\nwant x%s", d, got, want)
		}
		if s := string(appendInt(nil, n)); s != strconv.FormatInt(n, 10) {
			t.Fatalf("appendInt(%d) = %q", n, s)
		}
	}
}

// TestCheckRequestKeyAsConfig: for every key the fast path takes from a
// body (random bytes, U+FFFD, empty, at and over the length bound),
// checkRequestKey answers as config.CheckKey does, error text included;
// keys the fast path does not take go to CheckKey itself.
func TestCheckRequestKeyAsConfig(t *testing.T) {
	keys := []string{"", "a", "client-42", "\ufffd", "a\ufffdb", "\xff", "tab\there", strings.Repeat("k", httplimit.MaxKeyLen), strings.Repeat("k", httplimit.MaxKeyLen+1)}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		keys = append(keys, string(b))
	}
	fast := 0
	for _, k := range keys {
		body := []byte(`{"key":"` + k + `"}`)
		var req AllowRequest
		_, _, view, err := decodeAllowBody(body, nil, &req)
		if err != nil || !view {
			continue
		}
		fast++
		want, got := config.CheckKey(`"key"`, req.Key), checkRequestKey(req.Key, true)
		if (want == nil) != (got == nil) || want != nil && want.Error() != got.Error() {
			t.Fatalf("key %q: checkRequestKey %v, CheckKey %v", req.Key, got, want)
		}
		if strings.ContainsRune(req.Key, utf8.RuneError) {
			t.Fatalf("the fast path took %q, which holds U+FFFD", req.Key)
		}
	}
	if fast < 100 {
		t.Fatalf("only %d keys took the fast path", fast)
	}
	for _, k := range keys {
		want, got := config.CheckKey(`"key"`, k), checkRequestKey(k, false)
		if (want == nil) != (got == nil) || want != nil && want.Error() != got.Error() {
			t.Fatalf("key %q: checkRequestKey %v, CheckKey %v", k, got, want)
		}
	}
}
