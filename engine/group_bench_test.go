package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
)

// Group decisions beside the Limiter calls they replace, on 1,000 keys
// whose limits are never reached (every request is logged).
func BenchmarkGroup(b *testing.B) {
	const nkeys = 1000
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%06d", i)
	}
	second := engine.Policy{Name: "per_second", Limit: 1 << 20, Window: time.Second}
	hour := engine.Policy{Name: "per_hour", Limit: 1 << 20, Window: time.Hour}
	b.Run("limiter", func(b *testing.B) {
		lim, _ := engine.New(second)
		defer lim.Close()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			lim.Allow(keys[i%nkeys])
			i++
		}
	})
	b.Run("group-of-one", func(b *testing.B) {
		g, _ := engine.NewGroup([]engine.Policy{second})
		defer g.Close()
		b.ReportAllocs()
		ks := make([]string, 1)
		i := 0
		for b.Loop() {
			ks[0] = keys[i%nkeys]
			g.AllowN(ks, 1)
			i++
		}
	})
	// What a server asks through GroupBackend, reusing its decisions.
	b.Run("group-of-one-refs", func(b *testing.B) {
		g, _ := engine.NewGroup([]engine.Policy{second})
		defer g.Close()
		b.ReportAllocs()
		ctx, refs, dst := context.Background(), make([]engine.Ref, 1), make([]engine.Decision, 1)
		i := 0
		for b.Loop() {
			refs[0] = engine.Ref{Policy: 0, Key: keys[i%nkeys]}
			g.DecideGroup(ctx, dst, engine.GroupRequest{Refs: refs, N: 1})
			i++
		}
	})
	b.Run("two-limiters", func(b *testing.B) {
		l1, _ := engine.New(second)
		l2, _ := engine.New(hour)
		defer l1.Close()
		defer l2.Close()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := keys[i%nkeys]
			if l1.Allow(k).Allowed {
				l2.Allow(k)
			}
			i++
		}
	})
	b.Run("group-of-two", func(b *testing.B) {
		g, _ := engine.NewGroup([]engine.Policy{second, hour})
		defer g.Close()
		b.ReportAllocs()
		ks := make([]string, 2)
		i := 0
		for b.Loop() {
			ks[0], ks[1] = keys[i%nkeys], keys[i%nkeys]
			g.AllowN(ks, 1)
			i++
		}
	})
	b.Run("group-of-two-refs", func(b *testing.B) {
		g, _ := engine.NewGroup([]engine.Policy{second, hour})
		defer g.Close()
		b.ReportAllocs()
		ctx, refs, dst := context.Background(), make([]engine.Ref, 2), make([]engine.Decision, 2)
		i := 0
		for b.Loop() {
			k := keys[i%nkeys]
			refs[0], refs[1] = engine.Ref{Policy: 0, Key: k}, engine.Ref{Policy: 1, Key: k}
			g.DecideGroup(ctx, dst, engine.GroupRequest{Refs: refs, N: 1})
			i++
		}
	})
}
