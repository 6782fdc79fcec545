package redisstore

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// conn is what the package needs from a Redis client: run a script on one
// key, once. Implementations must not retry the script call by themselves
// (a retry after a client-side timeout can run the script twice and charge
// two slots for one request), must return when ctx is done, and must fall
// back from EVALSHA to EVAL on NOSCRIPT (after a restart or failover the
// server has forgotten the script).
type conn interface {
	eval(ctx context.Context, s *script, key string, args []string) ([]int64, error)
	// ping checks that the server answers (and that authentication and
	// database selection worked).
	ping(ctx context.Context) error
	close()
}

// rueidisConn is the production conn: rueidis, chosen by measurement
// (docs/distributed.md): its automatic pipelining shares few connections
// among many concurrent callers.
type rueidisConn struct {
	c rueidis.Client
}

var _ conn = (*rueidisConn)(nil)

func dialRueidis(t target, dialTimeout time.Duration) (*rueidisConn, error) {
	opt := rueidis.ClientOption{
		InitAddress:  t.addrs,
		Username:     t.username,
		Password:     t.password,
		SelectDB:     t.db,
		DisableCache: true,
		// Never retry on our behalf: see conn.
		DisableRetry: true,
		// Always through the pipeline: a lone call with a deadline would
		// otherwise be written synchronously, and its timeout would close
		// the connection (and reconnect, per timeout, while Redis is slow).
		AlwaysPipelining: true,
		Dialer:           net.Dialer{Timeout: dialTimeout},
		ConnWriteTimeout: max(dialTimeout, time.Second),
	}
	if !t.cluster {
		opt.ForceSingleClient = true
	} else {
		opt.ShuffleInit = true
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, err
	}
	return &rueidisConn{c: c}, nil
}

func (r *rueidisConn) eval(ctx context.Context, s *script, key string, args []string) ([]int64, error) {
	res, err := r.c.Do(ctx, r.c.B().Evalsha().Sha1(s.sha).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
	if err != nil && isNoScript(err) {
		// EVAL runs the script and caches it on that server again. The
		// EVALSHA did not run anything, so this is not a retry.
		res, err = r.c.Do(ctx, r.c.B().Eval().Script(s.body).Numkeys(1).Key(key).Arg(args...).Build()).AsIntSlice()
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

func (r *rueidisConn) close() { r.c.Close() }

func isNoScript(err error) bool {
	if re, ok := rueidis.IsRedisErr(err); ok {
		return re.IsNoScript()
	}
	return strings.HasPrefix(err.Error(), "NOSCRIPT")
}
