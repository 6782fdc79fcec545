package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slidegate/slidegate/internal/clientcore"
)

// ErrEvictionPolicy is wrapped by the error Open returns when a server's
// maxmemory-policy may evict the limiter's keys (anything but noeviction:
// every key has a TTL, so the volatile-* policies evict them too) and
// WithEvictionAllowed was not given. An evicted key is a forgotten limit:
// its client is admitted again, silently.
var ErrEvictionPolicy = errors.New("redisstore: the server may evict limiter keys")

// node is one Redis master: its circuit breaker and what the health check
// last saw of it. Its fields after br are owned by the health loop.
type node struct {
	addr  string
	br    *clientcore.Breaker
	probe *probe // the running liveness probe, if any; guarded by Store.probeMu
	// While a probe runs, calls that succeed on the node count as its
	// answer too (a busy host may read the PING's reply late).
	probing  atomic.Bool
	answered atomic.Bool
	ln       lane // its per-node lane (batch.go)

	runID   string
	evicted int64 // evicted_keys last seen; -1 before the first reading
	keys    int64 // keys in db0 last seen
	policy  string
}

// topology maps cluster slots to masters. It is immutable once published.
type topology struct {
	nodes []*node
	owner []int // per slot, an index into nodes; -1: unserved; nil: all on nodes[0]
}

// nodeOf returns the node that owns slot (by the latest topology), or the
// shared breaker of unserved slots.
func (s *Store) nodeOf(slot int) *node {
	tp := s.topo.Load()
	if tp.owner == nil {
		return tp.nodes[0]
	}
	if k := tp.owner[slot]; k >= 0 {
		return tp.nodes[k]
	}
	return s.unserved
}

// nodeFor returns the node of addr, creating it (with its breaker and its
// metrics at zero) the first time. s.nodesMu is held.
func (s *Store) nodeFor(addr string) *node {
	if n, ok := s.nodes[addr]; ok {
		return n
	}
	onChange := func(from, to clientcore.State, failures int, err error) {
		s.m.state.WithLabelValues(addr).Set(float64(to))
		s.m.transitions.WithLabelValues(addr, to.String()).Inc()
		args := []any{"from", from.String(), "to", to.String(), "node", addr, "store", s.name}
		if failures > 0 {
			args = append(args, "failures", failures)
		}
		if err != nil {
			args = append(args, "err", err)
		}
		if to == clientcore.StateOpen {
			args = append(args, "cooldown", s.cfg.cooldown, "failure_policy", s.cfg.failure.String())
			s.cfg.logger.Warn("redisstore: circuit breaker opened", args...)
		} else {
			s.cfg.logger.Info("redisstore: circuit breaker "+to.String(), args...)
		}
	}
	n := &node{addr: addr, br: clientcore.NewBreaker(s.cfg.threshold, s.cfg.cooldown, onChange), evicted: -1}
	n.ln.nd = n
	s.m.initNode(addr)
	s.nodes[addr] = n
	return n
}

// blame returns the node whose breaker a failed call charges: nd, the
// slot's master by the store's slot map, unless the error names another
// node the store knows (a connection error carries the remote address).
// During a failover the client may still route a slot to the old master
// after the store's map moved it: the old master's errors must not open
// the promoted replica's fresh breaker.
func (s *Store) blame(nd *node, err error) *node {
	var op *net.OpError
	if !errors.As(err, &op) || op.Addr == nil {
		return nd
	}
	a := op.Addr.String()
	if a == nd.addr {
		return nd
	}
	s.nodesMu.Lock()
	other, ok := s.nodes[a]
	s.nodesMu.Unlock()
	if ok {
		return other
	}
	return nd
}

// mastersOf returns c's masters and slot map (see conn.masters); a
// client that lists no master is an error.
func mastersOf(ctx context.Context, c conn) ([]string, []int, error) {
	addrs, owner, err := c.masters(ctx)
	if err == nil && len(addrs) == 0 {
		err = errors.New("redisstore: no master serves any slot")
	}
	return addrs, owner, err
}

// refreshTopology reads the masters and the slot map and publishes them.
// Breakers follow addresses: a promoted replica gets a fresh (closed) one.
func (s *Store) refreshTopology(ctx context.Context) error {
	addrs, owner, err := mastersOf(ctx, s.conn)
	if err != nil {
		return err
	}
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	tp := &topology{owner: owner}
	for _, a := range addrs {
		tp.nodes = append(tp.nodes, s.nodeFor(a))
	}
	s.topo.Store(tp)
	return nil
}

// checkNodeLanes turns per-node lanes on (batch.go) when the store is a
// cluster whose conn can address a master and every master accepts
// nodeBatchScript's flag (Redis 7.0 and later); else lanes stay per slot.
func (s *Store) checkNodeLanes(ctx context.Context) {
	if _, ok := s.conn.(nodeConn); !ok || !s.cluster {
		return
	}
	for _, n := range s.topo.Load().nodes {
		if _, err := s.conn.do(ctx, n.addr, "SCRIPT", "LOAD", nodeBatchScript.body); err != nil {
			s.cfg.logger.Info("redisstore: a master refused the script flag allow-cross-slot-keys: decisions batch per slot, not per master",
				"node", n.addr, "cause", err, "store", s.name)
			return
		}
	}
	s.nodeLanes = true
}

// infoFields parses the "field:value" lines of INFO.
func infoFields(info string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok {
			m[k] = v
		}
	}
	return m
}

// versionAtLeast reports whether a redis_version ("7.0.15") is at least
// major.minor. An empty or unparsable version passes: servers that speak
// the protocol without INFO's server section (some proxies) are let
// through, and a missing command fails their first script loudly.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return true
	}
	a, err1 := strconv.Atoi(parts[0])
	b, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return a > major || a == major && b >= minor
}

// dbKeys returns the keys count of db0 from INFO's keyspace line
// "db0:keys=N,expires=M,...".
func dbKeys(f map[string]string) int64 {
	v, ok := f["db0"]
	if !ok {
		return 0
	}
	for _, kv := range strings.Split(v, ",") {
		if k, n, ok := strings.Cut(kv, "="); ok && k == "keys" {
			x, _ := strconv.ParseInt(n, 10, 64)
			return x
		}
	}
	return 0
}

// checkNodes reads INFO from every master: at Open (first is true) it
// refuses an evicting server unless allowed; afterwards it logs and counts
// restarts (a changed run id: without persistence every limit held there
// is gone) and evictions.
func (s *Store) checkNodes(ctx context.Context, first bool) error {
	for _, n := range s.topo.Load().nodes {
		info, err := s.conn.do(ctx, n.addr, "INFO")
		if err != nil {
			if first && isServerErr(err) {
				// A managed service may deny INFO: start, and say what
				// could not be checked.
				s.unchecked(n.addr, err, "INFO", "maxmemory_policy", "version", "restarts")
				continue
			}
			if first {
				return fmt.Errorf("INFO on %s: %w", n.addr, err)
			}
			continue // the breaker and the error metrics tell about it
		}
		f := infoFields(info)
		if first && !versionAtLeast(f["redis_version"], 6, 2) {
			return fmt.Errorf("node %s runs Redis %q; redisstore needs 6.2 or later (its scripts use HRANDFIELD and SET KEEPTTL)", n.addr, f["redis_version"])
		}
		policy := f["maxmemory_policy"]
		if first && policy == "" {
			s.unchecked(n.addr, errors.New("INFO has no maxmemory_policy"), "INFO", "maxmemory_policy")
		}
		if policy != n.policy && policy != "" && policy != "noeviction" {
			if first && !s.cfg.allowEviction {
				return fmt.Errorf("%w: node %s has maxmemory-policy %s; set it to noeviction (a full server then refuses writes, which the failure policy handles), or accept forgotten limits with allow_eviction (WithEvictionAllowed)", ErrEvictionPolicy, n.addr, policy)
			}
			s.cfg.logger.Warn("redisstore: redis may evict limiter keys: evicted clients are admitted again",
				"node", n.addr, "maxmemory_policy", policy, "maxmemory", f["maxmemory"], "store", s.name)
		}
		n.policy = policy
		if ev, err := strconv.ParseInt(f["evicted_keys"], 10, 64); err == nil {
			if n.evicted >= 0 && ev > n.evicted {
				s.m.evictions.WithLabelValues(n.addr).Add(float64(ev - n.evicted))
				s.cfg.logger.Warn("redisstore: redis evicted keys: their clients' limits are forgotten",
					"node", n.addr, "evicted", ev-n.evicted, "maxmemory_policy", policy, "store", s.name)
			}
			n.evicted = ev
		}
		keys := dbKeys(f)
		if id := f["run_id"]; id != "" {
			if n.runID != "" && id != n.runID {
				s.m.restarts.WithLabelValues(n.addr).Inc()
				s.cfg.logger.Warn("redisstore: redis node restarted: limits it held are lost unless it reloaded them",
					"node", n.addr, "keys_before", n.keys, "keys_now", keys,
					"aof_enabled", f["aof_enabled"], "rdb_last_load_keys_loaded", f["rdb_last_load_keys_loaded"], "store", s.name)
			}
			n.runID = id
		}
		n.keys = keys
	}
	return nil
}

// unchecked logs and exports the start-up checks of node addr that cmd's
// failure (err) prevented.
func (s *Store) unchecked(addr string, err error, cmd string, checks ...string) {
	for _, c := range checks {
		s.m.unchecked.WithLabelValues(addr, c).Set(1)
	}
	msg := "redisstore: could not check the Redis node (" + cmd + " denied): " + strings.Join(checks, ", ")
	if slices.Contains(checks, "maxmemory_policy") {
		msg += "; make sure its maxmemory-policy is noeviction, or evicted clients are admitted again"
	}
	if slices.Contains(checks, "cluster_require_full_coverage") {
		msg += "; make sure cluster-require-full-coverage is no, or a down master fails every key"
	}
	s.cfg.logger.Warn(msg, "node", addr, "err", err, "store", s.name)
}

// warnCoverage logs when a cluster answers CLUSTERDOWN for every slot
// while any master is down (cluster-require-full-coverage yes, the
// default): a failing node then harms every key, not only its own.
func (s *Store) warnCoverage(ctx context.Context) {
	for _, n := range s.topo.Load().nodes {
		v, err := s.conn.do(ctx, n.addr, "CONFIG", "GET", "cluster-require-full-coverage")
		if err != nil {
			if isServerErr(err) {
				s.unchecked(n.addr, err, "CONFIG GET", "cluster_require_full_coverage")
			}
			continue
		}
		if strings.HasSuffix(strings.TrimSpace(v), "yes") {
			s.cfg.logger.Warn("redisstore: cluster-require-full-coverage is yes: while any master is down, every key is refused with CLUSTERDOWN (set it to no; docs/distributed.md)",
				"node", n.addr, "store", s.name)
			return
		}
	}
}

// health is the store's one background goroutine: every health interval,
// and soon after a failed call, it refreshes the slot map (a cluster's
// failover moves slots) and checks the nodes. It stops on Close.
type health struct {
	kick     chan struct{}
	done     sync.WaitGroup
	lastKick atomic.Int64 // unix ns of the latest refresh on a kick
}

// kickHealth asks the health loop for an early topology refresh.
func (s *Store) kickHealth() {
	select {
	case s.health.kick <- struct{}{}:
	default:
	}
}

func (s *Store) healthLoop() {
	defer s.health.done.Done()
	t := time.NewTicker(s.cfg.healthInterval)
	defer t.Stop()
	for {
		full := false
		select {
		case <-s.closed:
			return
		case <-t.C:
			full = true
		case <-s.health.kick:
			// At most one early refresh per 100 ms however many calls fail.
			now := time.Now().UnixNano()
			if now-s.health.lastKick.Load() < int64(100*time.Millisecond) {
				// Too soon for the topology, not for a lost library.
				ctx, cancel := context.WithTimeout(s.ctx, s.cfg.dialTimeout)
				s.loadFunctions(ctx, false)
				cancel()
				continue
			}
			s.health.lastKick.Store(now)
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.dialTimeout)
		if s.refresh {
			s.refreshTopology(ctx)
		}
		if full {
			s.checkNodes(ctx, false)
		}
		s.loadFunctions(ctx, false)
		cancel()
	}
}
