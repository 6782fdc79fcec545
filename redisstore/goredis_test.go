package redisstore

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// goredisConn runs the script through go-redis v9, the other candidate
// client, for the client comparison (BenchmarkClients). It lives in a test
// file so that the package does not import go-redis.
type goredisConn struct {
	c redis.UniversalClient
}

var _ conn = (*goredisConn)(nil)

func (g *goredisConn) eval(ctx context.Context, s *script, key string, args []string) ([]int64, error) {
	a := make([]any, len(args))
	for i, v := range args {
		a[i] = v
	}
	res, err := g.c.EvalSha(ctx, s.sha, []string{key}, a...).Int64Slice()
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		res, err = g.c.Eval(ctx, s.body, []string{key}, a...).Int64Slice()
	}
	return res, err
}

func (g *goredisConn) ping(ctx context.Context) error { return g.c.Ping(ctx).Err() }

func (g *goredisConn) masters(ctx context.Context) ([]string, []int, error) {
	return []string{"go-redis"}, nil, nil
}

// do answers as a server that cannot evict and has no run id to follow:
// the comparison measures decisions only.
func (g *goredisConn) do(ctx context.Context, addr string, args ...string) (string, error) {
	return "maxmemory_policy:noeviction\n", nil
}

func (g *goredisConn) close() { g.c.Close() }
