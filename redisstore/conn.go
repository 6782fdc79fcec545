package redisstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/slidegate/slidegate/redisstore/internal/slotmap"
)

// conn is what the package needs from a Redis client: run a script on one
// key, once. Implementations must not retry the script call by themselves
// (a retry after a client-side timeout can run the script twice and charge
// two slots for one request), must return when ctx is done, and must fall
// back from EVALSHA to EVAL on NOSCRIPT (after a restart or failover the
// server has forgotten the script).
type conn interface {
	eval(ctx context.Context, s *script, key string, args []string) ([]int64, error)
	// evalKeys is eval over several keys, which share a cluster slot.
	evalKeys(ctx context.Context, s *script, keys []string, args []string) ([]int64, error)
	// ping checks that the server answers (and that authentication and
	// database selection worked).
	ping(ctx context.Context) error
	// masters returns the address of every master and, for a cluster, the
	// index in it of each slot's master (nil for a standalone server; -1
	// for a slot no master serves).
	masters(ctx context.Context) (addrs []string, owner []int, err error)
	// do runs one command on the node at addr (from masters) and returns
	// its reply as a string (INFO, CONFIG GET's values joined by newlines).
	do(ctx context.Context, addr string, args ...string) (string, error)
	close()
}

// nodeConn is a conn that can run a script on one master by address, its
// keys passed as arguments (per-node lanes, batch.go).
type nodeConn interface {
	// evalOn runs s on the master at addr with no declared key. It
	// returns errNoNode, having sent nothing, when it has no connection
	// to addr.
	evalOn(ctx context.Context, addr string, s *script, args []string) ([]int64, error)
}

// errNoNode: the client has no connection to a master the store named.
var errNoNode = errors.New("redisstore: no connection to the node")

var _ nodeConn = (*rueidisConn)(nil)

// rueidisConn is the production conn: rueidis, chosen by measurement
// (docs/distributed.md): its automatic pipelining shares few connections
// among many concurrent callers.
type rueidisConn struct {
	c       rueidis.Client
	cluster bool
	fn      atomic.Bool // scripts run by FCALL (function.go)
	lost    atomic.Bool // an FCALL found no library: load it again
	denied  atomic.Bool // an FCALL was refused (NOPERM): EVALSHA for good
	kick    func()      // called then (the store's health check)
	tls     *tls.Config // of the store's connections; its liveness probes use it
	// The clients of single nodes (evalOn), from Nodes(); dropped when
	// masters re-reads the cluster's slots.
	nodeCli atomic.Pointer[map[string]rueidis.Client]
}

var _ conn = (*rueidisConn)(nil)

func dialRueidis(t target, cfg *config) (*rueidisConn, error) {
	opt := t.opt
	opt.DisableCache = true
	// Never retry on our behalf: see conn.
	opt.DisableRetry = true
	// Always through the pipeline: a lone call with a deadline would
	// otherwise be written synchronously, and its timeout would close the
	// connection (and reconnect, per timeout, while Redis is slow).
	opt.AlwaysPipelining = true
	opt.Dialer = net.Dialer{Timeout: cfg.dialTimeout}
	opt.ConnWriteTimeout = max(cfg.dialTimeout, time.Second)
	tc, err := cfg.tls.build(opt.TLSConfig, t.tls)
	if err != nil {
		return nil, err
	}
	opt.TLSConfig = tc
	if cfg.sentinelPass != "" && t.kind != sentinel {
		return nil, fmt.Errorf("%w: sentinel credentials need a redis-sentinel:// URL", ErrInvalidOption)
	}
	switch t.kind {
	case standalone:
		opt.ForceSingleClient = true
	case cluster:
		opt.ShuffleInit = true
	case sentinel:
		opt.Sentinel.Username, opt.Sentinel.Password = cfg.sentinelUser, cfg.sentinelPass
		opt.Sentinel.Dialer = opt.Dialer
		opt.Sentinel.TLSConfig = tc
		// Besides following +switch-master, re-read the master from the
		// sentinels now and then: one missed event would otherwise bind
		// the store to a demoted master.
		opt.Sentinel.TopologyRefreshInterval = sentinelRefresh
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, err
	}
	return &rueidisConn{c: c, cluster: t.kind == cluster, tls: tc}, nil
}

// sentinelRefresh is how often a Sentinel store re-reads its master from
// the sentinels, in addition to their +switch-master events.
const sentinelRefresh = 2 * time.Second

func (r *rueidisConn) eval(ctx context.Context, s *script, key string, args []string) ([]int64, error) {
	if r.fn.Load() {
		res, err := r.c.Do(ctx, r.c.B().Fcall().Function(s.fnName()).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
		if err == nil || !r.fcallFailed(err) {
			return res, err
		}
		// The FCALL ran nothing: EVALSHA decides this call.
	}
	res, err := r.c.Do(ctx, r.c.B().Evalsha().Sha1(s.sha).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
	if err != nil && isNoScript(err) {
		// EVAL runs the script and caches it on that server again. The
		// EVALSHA did not run anything, so this is not a retry.
		res, err = r.c.Do(ctx, r.c.B().Eval().Script(s.body).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
	}
	return res, err
}

func (r *rueidisConn) evalKeys(ctx context.Context, s *script, keys []string, args []string) ([]int64, error) {
	if r.fn.Load() {
		res, err := r.c.Do(ctx, r.c.B().Fcall().Function(s.fnName()).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
		if err == nil || !r.fcallFailed(err) {
			return res, err
		}
	}
	res, err := r.c.Do(ctx, r.c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	if err != nil && isNoScript(err) {
		res, err = r.c.Do(ctx, r.c.B().Eval().Script(s.body).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
	}
	return res, err
}

func (r *rueidisConn) evalOn(ctx context.Context, addr string, s *script, args []string) ([]int64, error) {
	var c rueidis.Client
	if m := r.nodeCli.Load(); m != nil {
		c = (*m)[addr]
	}
	if c == nil {
		m := r.c.Nodes()
		r.nodeCli.Store(&m)
		if c = m[addr]; c == nil {
			return nil, errNoNode
		}
	}
	if r.fn.Load() {
		res, err := c.Do(ctx, c.B().Fcall().Function(s.fnName()).Numkeys(0).Arg(args...).Build()).AsIntSlice()
		if err == nil || !r.fcallFailed(err) {
			return res, err
		}
	}
	res, err := c.Do(ctx, c.B().Evalsha().Sha1(s.sha).Numkeys(0).Arg(args...).Build()).AsIntSlice()
	if err != nil && isNoScript(err) {
		res, err = c.Do(ctx, c.B().Eval().Script(s.body).Numkeys(0).Arg(args...).Build()).AsIntSlice()
	}
	return res, err
}

func (r *rueidisConn) ping(ctx context.Context) error {
	for addr, node := range r.c.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
	}
	return nil
}

func (r *rueidisConn) masters(ctx context.Context) ([]string, []int, error) {
	if !r.cluster {
		for addr := range r.c.Nodes() {
			return []string{addr}, nil, nil
		}
		return nil, nil, fmt.Errorf("redisstore: no node")
	}
	r.nodeCli.Store(nil)
	ranges, err := r.c.Do(ctx, r.c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, nil, err
	}
	sm := slotmap.New()
	for _, rg := range ranges {
		f, err := rg.ToArray()
		if err != nil || len(f) < 3 {
			return nil, nil, fmt.Errorf("redisstore: %w", slotmap.ErrMalformed)
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		m, err3 := f[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(m) < 2 {
			return nil, nil, fmt.Errorf("redisstore: %w", slotmap.ErrMalformed)
		}
		host, _ := m[0].ToString()
		port, _ := m[1].AsInt64()
		if err := sm.Add(lo, hi, net.JoinHostPort(host, strconv.FormatInt(port, 10))); err != nil {
			return nil, nil, fmt.Errorf("redisstore: %w", err)
		}
	}
	return sm.Addrs, sm.Owner, nil
}

func (r *rueidisConn) do(ctx context.Context, addr string, args ...string) (string, error) {
	node, ok := r.c.Nodes()[addr]
	if !ok {
		return "", fmt.Errorf("redisstore: no connection to node %s", addr)
	}
	res := node.Do(ctx, node.B().Arbitrary(args[0]).Args(args[1:]...).Build())
	if s, err := res.ToString(); err == nil {
		return s, nil
	}
	if m, err := res.AsStrMap(); err == nil {
		// RESP3 answers CONFIG GET with a map: render it as RESP2's
		// array, name then value.
		var out []string
		for k, v := range m {
			out = append(out, k, v)
		}
		return strings.Join(out, "\n"), nil
	}
	vals, err := res.ToArray()
	if err != nil {
		return "", err
	}
	var out []string
	for _, v := range vals {
		s, _ := v.ToString()
		out = append(out, s)
	}
	return strings.Join(out, "\n"), nil
}

func (r *rueidisConn) close() { r.c.Close() }

func isNoScript(err error) bool {
	if re, ok := rueidis.IsRedisErr(err); ok {
		return re.IsNoScript()
	}
	return strings.HasPrefix(err.Error(), "NOSCRIPT")
}
