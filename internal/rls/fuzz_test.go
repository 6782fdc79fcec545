package rls_test

import (
	"context"
	"errors"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/internal/rls"
)

// Any request built from fuzz input gets a decision or a gRPC status,
// never a panic, and every decision has one status per descriptor.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add("edge", []byte("remote_address\x00192.0.2.1\x01path\x00/login\x00remote_address\x00x"), uint32(0), uint64(0))
	f.Add("", []byte{}, uint32(1<<31), uint64(1<<40))
	f.Add("edge", []byte("\x00\x00\x01\x01"), uint32(3), uint64(2))
	cfg, err := rls.ParseConfig("fuzz.yaml", []byte(sampleConfig))
	if err != nil {
		f.Fatal(err)
	}
	g, err := cfg.NewGroup()
	if err != nil {
		f.Fatal(err)
	}
	defer g.Close()
	svc, err := rls.New(cfg, g)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, domain string, spec []byte, hits uint32, dhits uint64) {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
		// spec: descriptors separated by 0x01, entries by pairs of
		// 0x00-separated key and value.
		var cur *ratelimitv3.RateLimitDescriptor
		parts := splitByte(spec, 0x01)
		for i, p := range parts {
			cur = &ratelimitv3.RateLimitDescriptor{}
			kv := splitByte(p, 0x00)
			for j := 0; j+1 < len(kv); j += 2 {
				cur.Entries = append(cur.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: string(kv[j]), Value: string(kv[j+1])})
			}
			if i == 0 && dhits > 0 {
				cur.HitsAddend = wrapperspb.UInt64(dhits)
			}
			req.Descriptors = append(req.Descriptors, cur)
		}
		resp, err := svc.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if _, ok := status.FromError(err); !ok {
				t.Fatalf("not a gRPC status: %v", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
	})
}

func splitByte(b []byte, sep byte) [][]byte {
	if len(b) == 0 {
		return nil
	}
	var out [][]byte
	start := 0
	for i, c := range b {
		if c == sep {
			out = append(out, b[start:i])
			start = i + 1
		}
	}
	return append(out, b[start:])
}

// Any file gets a configuration or an error wrapping ErrConfig, never a
// panic; a configuration's policies are all valid.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(sampleConfig))
	f.Add([]byte(precedenceConfig))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: &r {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: *r\n"))
	f.Add([]byte("domain: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := rls.ParseConfig("f.yaml", data)
		if err != nil {
			if !errors.Is(err, rls.ErrConfig) {
				t.Fatalf("error not wrapping ErrConfig: %v", err)
			}
			return
		}
		for i, p := range c.Policies() {
			if err := p.Validate(); err != nil {
				t.Fatalf("policy %d: %v", i, err)
			}
		}
	})
}
