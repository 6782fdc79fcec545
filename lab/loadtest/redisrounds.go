package loadtest

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/slidegate/slidegate/lab/internal/keydist"
	"github.com/slidegate/slidegate/redisstore"
)

// The redis phase's target: the Redis store's decisions per second of
// Redis CPU, against redis-benchmark's requests per second of Redis CPU
// on the very command the store sends. In each round the store's
// callers make a burst of decisions at full speed and redis-benchmark
// sends as many commands with as many clients, in turn (which goes first
// alternates); Redis's own CPU (INFO cpu, summed over the masters) over
// each gives the calls per Redis core-second. A round's ratio is the
// store's over redis-benchmark's: the Redis core a decision costs through
// the store, against the least the same script costs. Rounds during which
// other processes (not Redis, not redis-benchmark, not this one) used
// over engineBusy cores, or with a failure, are left out and run again.

// redisTarget is the Redis target. A round's figures are calls per Redis
// core-second, slidegate's the store's and the reference's
// redis-benchmark's; the store's over redis-benchmark's must be at least
// 0.90.
var redisTarget = turnTarget{goal: goal{Bound: 0.90}}

var cpuLine = regexp.MustCompile(`(?m)^used_cpu_(?:sys|user):([0-9.]+)`)

// redisCPU sums used_cpu_sys and used_cpu_user (seconds) over the nodes.
func redisCPU(ctx context.Context, c rueidis.Client) (float64, error) {
	var s float64
	for addr, n := range c.Nodes() {
		info, err := n.Do(ctx, n.B().Info().Section("cpu").Build()).ToString()
		if err != nil {
			return 0, fmt.Errorf("INFO cpu on %s: %w", addr, err)
		}
		for _, m := range cpuLine.FindAllStringSubmatch(info, -1) {
			v, _ := strconv.ParseFloat(m[1], 64)
			s += v
		}
	}
	return s, nil
}

// runRedisRounds runs the target's rounds against one deployment, until
// minJudgeRounds clean ones (or twice that in all), n calls per pass;
// bench is redis-benchmark's arguments less -n.
func runRedisRounds(ctx context.Context, cfg Config, admin rueidis.Client, lim *redisstore.Limiter, bench []string, n int64) ([]turnRound, error) {
	return runTurns(minJudgeRounds, func(r int, isBench bool) (float64, int, float64, error) {
		c0, err := redisCPU(ctx, admin)
		if err != nil {
			return 0, 0, 0, err
		}
		var errs int
		benchOwn := 0.0
		if isBench {
			benchOwn, err = runBenchmark(ctx, bench, n)
			if err != nil {
				errs++
			}
		} else {
			errs = redisBurst(ctx, cfg, lim, n, uint64(r))
		}
		c1, err := redisCPU(ctx, admin)
		if err != nil {
			return 0, 0, 0, err
		}
		perCore := 0.0
		if c1 > c0 {
			perCore = float64(n) / (c1 - c0)
		}
		return perCore, errs, c1 - c0 + benchOwn, nil
	})
}

// runBenchmark runs redis-benchmark with args and -n n, and returns the
// CPU it used, in seconds.
func runBenchmark(ctx context.Context, args []string, n int64) (float64, error) {
	bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "redis-benchmark", append([]string{"-n", strconv.FormatInt(n, 10)}, args...)...)
	out, err := cmd.CombinedOutput()
	cpu := 0.0
	if ps := cmd.ProcessState; ps != nil {
		cpu = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	if err != nil {
		return cpu, fmt.Errorf("redis-benchmark: %v: %s", err, lastLine(string(out)))
	}
	return cpu, nil
}

// redisBurst makes n decisions through lim from cfg.RedisCallers callers
// at full speed, and returns how many failed.
func redisBurst(ctx context.Context, cfg Config, lim *redisstore.Limiter, n int64, round uint64) int {
	var left, failed atomic.Int64
	left.Store(n)
	var wg sync.WaitGroup
	for c := range cfg.RedisCallers {
		ch, err := keydist.NewChooser(cfg.Dist, cfg.Clients, cfg.ZipfS, cfg.Seed, 2_000_000+round*4096+uint64(c))
		if err != nil {
			failed.Add(1)
			continue
		}
		wg.Go(func() {
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				if _, err := lim.Decide(ctx, clientKey(ch.Next()), ch.Cost(cfg.MaxCost)); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(failed.Load())
}

// writeRedisRounds writes a deployment's target rounds.
func writeRedisRounds(p func(string, ...any), d redisDeployment) {
	if len(d.Rounds) == 0 {
		return
	}
	p("  target: %d rounds of %s calls through the store and by redis-benchmark in turn; calls per second of Redis CPU (INFO cpu):", len(d.Rounds), commas(d.RoundCalls))
	for i, rd := range d.Rounds {
		p("    round %d: store %s/s, redis-benchmark %s/s; store / redis-benchmark %s%s", i+1, si(rd.Slidegate), si(rd.Reference),
			fmtRatio(redisTarget.ratio(rd), redisTarget.Bound), rd.note("failures"))
	}
}
