// Package goredisstore lets a program that already holds a go-redis
// client (github.com/redis/go-redis/v9) use it for a redisstore.Store:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	c, err := goredisstore.New(rdb)
//	...
//	st, err := redisstore.OpenClient("redis://127.0.0.1:6379", c)
//
// It is a package of its own so that redisstore's users who do not use
// go-redis do not import it.
package goredisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/slidegate/slidegate/redisstore"
	"github.com/slidegate/slidegate/redisstore/internal/slotmap"
)

// ErrUnsupported is wrapped by New's errors about a client it cannot
// adapt.
var ErrUnsupported = errors.New("goredisstore: unsupported client")

// New adapts c, a *redis.Client (also a Sentinel failover client) or a
// *redis.ClusterClient, to redisstore.Client. c must have
// ContextTimeoutEnabled set, so that the store's per-decision deadline
// bounds each call (without it go-redis waits for its read timeout,
// seconds). Script calls are marked not to be retried, whatever c's
// MaxRetries says; a cluster client still follows MOVED and ASK.
func New(c redis.UniversalClient) (redisstore.Client, error) {
	switch x := c.(type) {
	case *redis.Client:
		if !x.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("%w: set ContextTimeoutEnabled in redis.Options so that the store's deadlines bound its calls", ErrUnsupported)
		}
		return &client{c: c, single: x}, nil
	case *redis.ClusterClient:
		if !x.Options().ContextTimeoutEnabled {
			return nil, fmt.Errorf("%w: set ContextTimeoutEnabled in redis.ClusterOptions so that the store's deadlines bound its calls", ErrUnsupported)
		}
		return &client{c: c, cluster: x}, nil
	case nil:
		return nil, fmt.Errorf("%w: nil client", ErrUnsupported)
	}
	return nil, fmt.Errorf("%w: %T (a Ring shards keys by its own hash; use a Client or a ClusterClient)", ErrUnsupported, c)
}

type client struct {
	c       redis.UniversalClient
	single  *redis.Client
	cluster *redis.ClusterClient
}

// noRetry is a command go-redis must not send twice.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

func (g *client) eval(ctx context.Context, name, script string, keys, args []string) ([]int64, error) {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, script, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	for _, v := range args {
		a = append(a, v)
	}
	cmd := redis.NewCmd(ctx, a...)
	cmd.SetFirstKeyPos(3)
	if err := g.c.Process(ctx, noRetry{cmd}); err != nil {
		return nil, err
	}
	return cmd.Int64Slice()
}

func (g *client) EvalSha(ctx context.Context, sha string, keys, args []string) ([]int64, error) {
	return g.eval(ctx, "evalsha", sha, keys, args)
}

func (g *client) Eval(ctx context.Context, script string, keys, args []string) ([]int64, error) {
	return g.eval(ctx, "eval", script, keys, args)
}

func (g *client) Masters(ctx context.Context) ([]string, []int, error) {
	if g.cluster == nil {
		return []string{g.single.Options().Addr}, nil, nil
	}
	//lint:ignore SA1019 CLUSTER SHARDS needs Redis 7; the store supports 6.2.
	slots, err := g.cluster.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, nil, err
	}
	sm := slotmap.New()
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			return nil, nil, fmt.Errorf("goredisstore: %w", slotmap.ErrMalformed)
		}
		a := s.Nodes[0].Addr
		if host, port, err := net.SplitHostPort(a); err == nil {
			a = net.JoinHostPort(host, port)
		}
		if err := sm.Add(int64(s.Start), int64(s.End), a); err != nil {
			return nil, nil, fmt.Errorf("goredisstore: %w", err)
		}
	}
	return sm.Addrs, sm.Owner, nil
}

func (g *client) Do(ctx context.Context, addr string, args ...string) (string, error) {
	a := make([]any, len(args))
	for i, v := range args {
		a[i] = v
	}
	var res any
	var err error
	if g.cluster == nil {
		res, err = g.single.Do(ctx, a...).Result()
	} else {
		found := false
		err = g.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if c.Options().Addr != addr {
				return nil
			}
			found = true
			var e error
			res, e = c.Do(ctx, a...).Result()
			return e
		})
		if err == nil && !found {
			err = fmt.Errorf("goredisstore: no master %s", addr)
		}
	}
	if err != nil {
		return "", err
	}
	return reply(res), nil
}

// reply renders a reply as redisstore.Client.Do's string.
func reply(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = reply(e)
		}
		return strings.Join(parts, "\n")
	case map[any]any:
		var parts []string
		for k, e := range x {
			parts = append(parts, reply(k), reply(e))
		}
		return strings.Join(parts, "\n")
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}
