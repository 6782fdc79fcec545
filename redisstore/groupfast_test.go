package redisstore

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/backendtest"
	"github.com/slidegate/slidegate/internal/reference"
)

// TestGroupFastPathReplay replays group requests decided under Redis TIME
// (the clock under which the group script's fast path also takes new
// clients and their second entries in their buckets) against one
// reference model per policy, standalone and on the Cluster with a tag.
// The trace mixes new clients, clients in their bucket, rings read whole
// and rings read in part (one that expires as it goes, one that fills
// without expiring), in allowed and refused requests (a refusal
// moves a bucket's client to its own key), with entries expiring on the
// server's clock and some requests of cost 2 (the general code).
func TestGroupFastPathReplay(t *testing.T) {
	ps := []engine.Policy{
		{Name: "a", Limit: 3, Window: 60 * time.Millisecond},
		{Name: "b", Limit: 2, Window: 40 * time.Millisecond},
		// Beyond 64 slots a ring is read in part.
		{Name: "c", Limit: 90, Window: 250 * time.Millisecond},
		// A long ring that fills without expiring and refuses, then
		// (after a pause) expires as it goes.
		{Name: "d", Limit: 150, Window: 2 * time.Second},
	}
	for _, c := range []struct {
		name string
		url  func(testing.TB) string
		tag  string
	}{{"Standalone", standaloneURL, ""}, {"ClusterTagged", clusterURL, "t1"}} {
		t.Run(c.name, func(t *testing.T) {
			st, _, g := openGroup(t, c.url(t), ps, WithKeyPrefix(testPrefix(t)), WithRefusalCache(0))
			defer st.Close()
			r := rand.New(rand.NewPCG(39, 2))
			ctx := context.Background()
			var recs []reference.GroupRecord
			fresh := 0
			// Outcomes the trace must hold: a refused request with a limit
			// that had room and one entry (a client of one entry, held in
			// its bucket or own key, whose request another limit refused),
			// and the long ring's peak.
			refusedWithOne, peak, full := 0, 0, 0
			for i := range 1500 {
				if i == 200 {
					time.Sleep(ps[3].Window * 6 / 10)
				}
				var refs []engine.Ref
				key := func(pool int) string {
					// A new client now and then: its first request, then
					// its second from the pool.
					if r.IntN(4) == 0 {
						fresh++
						return "n" + strconv.Itoa(fresh)
					}
					return "p" + strconv.Itoa(r.IntN(pool))
				}
				if r.IntN(3) != 0 {
					refs = append(refs, engine.Ref{Policy: 0, Key: key(6)})
				}
				if r.IntN(2) == 0 {
					refs = append(refs, engine.Ref{Policy: 1, Key: key(4)})
				}
				if r.IntN(2) == 0 || len(refs) == 0 {
					refs = append(refs, engine.Ref{Policy: 2, Key: "hot"})
				}
				if i < 200 || r.IntN(3) == 0 {
					refs = append(refs, engine.Ref{Policy: 3, Key: "long"})
				}
				n := 1
				if r.IntN(10) == 0 {
					n = 2
				}
				if r.IntN(20) == 0 {
					time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
				}
				gd, err := g.DecideGroup(ctx, nil, engine.GroupRequest{Refs: refs, N: n, Tag: c.tag})
				if err != nil {
					t.Fatal(err)
				}
				for j, ref := range refs {
					d := gd.Limits[j]
					if !gd.Allowed && d.Allowed && d.Remaining == ps[ref.Policy].Limit-1 && ref.Policy < 2 {
						refusedWithOne++
					}
					if ref.Policy == 2 && gd.Allowed {
						peak = max(peak, ps[2].Limit-d.Remaining)
					}
					if ref.Policy == 3 && !d.Allowed {
						full++
					}
				}
				recs = append(recs, backendtest.GroupRecord(refs, n, gd))
			}
			if refusedWithOne == 0 || peak <= 64 || full == 0 {
				t.Fatalf("the trace made %d refusals beside a one-entry client, a ring of at most %d entries and %d refusals of the full long ring: it does not cover the fast path", refusedWithOne, peak, full)
			}
			backendtest.VerifyGroupAt(t, ps, recs, time.Microsecond)
		})
	}
}
