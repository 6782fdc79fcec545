package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// Client is a Redis client a program already holds, for OpenClient: the
// store runs its scripts and health checks through it instead of dialing
// its own connection. RueidisClient adapts a rueidis.Client; the
// goredisstore subpackage adapts a go-redis UniversalClient.
//
// The rules an implementation must keep, which the store's correctness
// rests on:
//
//   - EvalSha and Eval run the command once: no retry after the command
//     may have been written (a retry after a client-side timeout can run
//     the script twice and charge two slots for one request). Retrying a
//     command that was never sent, or following a MOVED or ASK
//     redirection, is fine.
//   - They return when ctx is done, whatever the server does.
//   - An error the server replied with (NOSCRIPT, OOM, READONLY...) keeps
//     its message, starting with the Redis error code, and is either a
//     *rueidis.RedisError or has a RedisError() method (go-redis's
//     redis.Error): every other error is taken to mean the script may have
//     run. The store falls back from EVALSHA to EVAL on NOSCRIPT itself.
//   - Masters lists the masters: one address and a nil owner for a
//     standalone server (or the master a Sentinel names); for Redis
//     Cluster every master, and per slot (16384 of them) the index in addrs
//     of its master, -1 for a slot no master serves. The store calls it
//     every health interval, so a failover's new master gets its own
//     circuit breaker.
//   - Do runs one command on the master at addr (from Masters) and returns
//     its reply as a string, an array's elements joined by newlines.
//
// The store never closes a Client: its owner does, after Store.Close.
type Client interface {
	EvalSha(ctx context.Context, sha string, keys, args []string) ([]int64, error)
	Eval(ctx context.Context, script string, keys, args []string) ([]int64, error)
	Masters(ctx context.Context) (addrs []string, owner []int, err error)
	Do(ctx context.Context, addr string, args ...string) (string, error)
}

// OpenClient makes a store on c, a client the caller owns (Close leaves
// it open). name identifies the store in logs (it must hold no password).
// Open's checks run: c must answer, servers must run Redis 6.2 or later,
// and a maxmemory-policy that may evict keys is refused unless
// WithEvictionAllowed. Options that configure dialing (WithDialTimeout
// bounds only the checks; the TLS options) have no effect on c.
func OpenClient(name string, c Client, opts ...Option) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOption)
	}
	return open(name, &clientConn{c: c}, opts)
}

// clientConn is the conn of a caller's Client.
type clientConn struct{ c Client }

var _ conn = (*clientConn)(nil)

func (c *clientConn) eval(ctx context.Context, s *script, key string, args []string) ([]int64, error) {
	return c.evalKeys(ctx, s, []string{key}, args)
}

func (c *clientConn) evalKeys(ctx context.Context, s *script, keys []string, args []string) ([]int64, error) {
	res, err := c.c.EvalSha(ctx, s.sha, keys, args)
	if err != nil && isNoScript(err) {
		// EVAL runs the script and caches it on that server again. The
		// EVALSHA did not run anything, so this is not a retry.
		res, err = c.c.Eval(ctx, s.body, keys, args)
	}
	return res, err
}

func (c *clientConn) ping(ctx context.Context) error {
	addrs, _, err := mastersOf(ctx, c)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if _, err := c.c.Do(ctx, a, "PING"); err != nil {
			return fmt.Errorf("%s: %w", a, err)
		}
	}
	return nil
}

func (c *clientConn) masters(ctx context.Context) ([]string, []int, error) {
	addrs, owner, err := c.c.Masters(ctx)
	if err == nil && owner != nil && len(owner) != numSlots {
		err = fmt.Errorf("redisstore: the client's slot map has %d slots, want %d", len(owner), numSlots)
	}
	for _, k := range owner {
		if k < -1 || k >= len(addrs) {
			return nil, nil, fmt.Errorf("redisstore: the client's slot map names master %d of %d", k, len(addrs))
		}
	}
	return addrs, owner, err
}

func (c *clientConn) do(ctx context.Context, addr string, args ...string) (string, error) {
	return c.c.Do(ctx, addr, args...)
}

func (c *clientConn) close() {}

// RueidisClient adapts c for OpenClient. c should have DisableCache set
// (the scripts go through Do, never the client-side cache either way);
// rueidis retries only read-only commands, so EVALSHA is never retried.
// Without AlwaysPipelining a call with a deadline is written on its own,
// and its timeout closes the connection: set it, as Open does.
func RueidisClient(c rueidis.Client) Client {
	return &rueidisConn{c: c, cluster: c.Mode() == rueidis.ClientModeCluster}
}

var _ Client = (*rueidisConn)(nil)

func (r *rueidisConn) EvalSha(ctx context.Context, sha string, keys, args []string) ([]int64, error) {
	return r.c.Do(ctx, r.c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
}

func (r *rueidisConn) Eval(ctx context.Context, script string, keys, args []string) ([]int64, error) {
	return r.c.Do(ctx, r.c.B().Eval().Script(script).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsIntSlice()
}

func (r *rueidisConn) Masters(ctx context.Context) ([]string, []int, error) { return r.masters(ctx) }

func (r *rueidisConn) Do(ctx context.Context, addr string, args ...string) (string, error) {
	return r.do(ctx, addr, args...)
}
