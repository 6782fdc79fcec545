// Command redispeers runs slidegate's Redis store beside the Redis
// limiters a Go user would pick instead, each through its own public API
// and client, in one process, interleaved in rounds, on one Redis server
// and on a Redis Cluster (make bench-redis-peers starts both on loopback).
// For each deployment and workload it prints decisions per second, Redis
// CPU and Redis commands per decision, and the most requests any key had
// admitted in one window, against the limit.
//
// Each cell flushes the servers, opens the limiter, warms it up, and runs
// the callers for -duration. Keys are built per request as a server
// builds them. Redis CPU is the servers' used_cpu_sys + used_cpu_user
// (INFO cpu) over the cell; commands are total_commands_processed (INFO
// stats), which counts the commands a script calls as well as the script;
// round trips are counted in the client (a go-redis hook; slidegate's
// store metrics, one per script call): a command, a pipeline or a
// script call each count one, and so does a call carrying several
// slidegate decisions.
// A decision answered from a client-side cache costs Redis nothing, and
// slidegate's refusal cache is one. A peer's errors (throttled's
// compare-and-swap gives up under contention) are counted, not fatal.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/lab/internal/keydist"
	rpdoc "github.com/slidegate/slidegate/lab/internal/redispeersdoc"
)

type workload struct {
	name string
	dist string
	keys int
}

var workloads = map[string]workload{
	"uniform": {"100k keys uniform", "uniform", 100_000},
	"zipf":    {"1M keys Zipf s=1.1", "zipf", 1_000_000},
	"hot":     {"one hot key", "uniform", 1},
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("redispeers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 3*time.Second, "timed run of each cell")
	rounds := fs.Int("rounds", 3, "rounds; each runs every peer once per deployment and workload")
	callers := fs.Int("callers", 64, "concurrent callers")
	limit := fs.Int("limit", 100, "the limit L")
	window := fs.Duration("window", time.Minute, "the window W")
	wls := fs.String("workloads", "uniform,zipf,hot", "workloads: uniform, zipf, hot")
	deps := fs.String("deployments", "standalone,cluster", "deployments: standalone, cluster")
	only := fs.String("peers", "", "comma-separated peers to run (default: all)")
	jsonOut := fs.String("json", "", "also write every cell to this JSON `file`")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var dl []deployment
	for _, d := range strings.Split(*deps, ",") {
		switch d {
		case "standalone":
			a := os.Getenv("SLIDEGATE_REDIS_ADDR")
			if a == "" {
				fmt.Fprintln(stderr, "redispeers: SLIDEGATE_REDIS_ADDR is not set (make bench-redis-peers sets it)")
				return 2
			}
			dl = append(dl, deployment{name: "one server", addrs: []string{a}})
		case "cluster":
			a := os.Getenv("SLIDEGATE_REDIS_CLUSTER_ADDRS")
			if a == "" {
				fmt.Fprintln(stderr, "redispeers: SLIDEGATE_REDIS_CLUSTER_ADDRS is not set (make bench-redis-peers sets it)")
				return 2
			}
			dl = append(dl, deployment{name: "Cluster (3 masters)", addrs: strings.Split(a, ","), cluster: true})
		default:
			fmt.Fprintf(stderr, "redispeers: unknown deployment %q\n", d)
			return 2
		}
	}
	var wl []workload
	for _, w := range strings.Split(*wls, ",") {
		x, ok := workloads[w]
		if !ok {
			fmt.Fprintf(stderr, "redispeers: unknown workload %q\n", w)
			return 2
		}
		wl = append(wl, x)
	}
	ps := peers
	if *only != "" {
		ps = nil
		for _, name := range strings.Split(*only, ",") {
			i := slices.IndexFunc(peers, func(p peer) bool { return p.name == name })
			if i < 0 {
				fmt.Fprintf(stderr, "redispeers: unknown peer %q\n", name)
				return 2
			}
			ps = append(ps, peers[i])
		}
	}
	ctx := context.Background()
	set := settings{limit: *limit, window: *window, callers: *callers, duration: *duration, rounds: *rounds}
	began := time.Now()
	var cells []rpdoc.Cell
	for r := 1; r <= *rounds; r++ {
		for _, d := range dl {
			for _, w := range wl {
				for _, p := range ps {
					c, err := runCell(ctx, p, d, w, set)
					if err != nil {
						fmt.Fprintf(stderr, "redispeers: %s on %s, %s: %v\n", p.name, d.name, w.name, err)
						return 1
					}
					c.Round = r
					cells = append(cells, c)
					fmt.Fprintf(stderr, "round %d/%d %s, %s, %s: %.0f/s, %.1f µs Redis CPU, %.2f commands, %.2f round trips, most %d in a window, %d errors\n",
						r, *rounds, d.name, w.name, p.name, c.PerSecond, c.RedisCPUus, c.Commands, c.RoundTrips, c.MostInWindow, c.Errors)
				}
			}
		}
	}
	var table strings.Builder
	report(io.MultiWriter(stdout, &table), cells, ps, dl, wl, set)
	if *jsonOut != "" {
		doc := rpdoc.Doc{
			Started: began.UTC(), DurationNs: int64(time.Since(began)), Cores: runtime.NumCPU(), GoVersion: runtime.Version(),
			Callers: set.callers, Limit: set.limit, WindowNs: int64(set.window), CellNs: int64(set.duration), Rounds: set.rounds,
			Table: table.String(), Cells: cells,
		}
		b, _ := json.MarshalIndent(doc, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(stderr, "redispeers:", err)
			return 1
		}
	}
	return 0
}

// settings are a run's parameters, the same for every cell.
type settings struct {
	limit    int
	window   time.Duration
	callers  int
	duration time.Duration
	rounds   int
}

// runCell runs one peer on one deployment and workload.
func runCell(ctx context.Context, p peer, d deployment, w workload, set settings) (rpdoc.Cell, error) {
	limit, window, callers, dur := set.limit, set.window, set.callers, set.duration
	admin := make([]*redis.Client, len(d.addrs))
	for i, a := range d.addrs {
		admin[i] = redis.NewClient(&redis.Options{Addr: a})
		defer admin[i].Close()
		if err := admin[i].FlushAll(ctx).Err(); err != nil {
			return rpdoc.Cell{}, fmt.Errorf("FLUSHALL %s: %w", a, err)
		}
	}
	l, err := p.open(d, limit, window)
	if err != nil {
		return rpdoc.Cell{}, err
	}
	defer l.Close()
	type event struct {
		key int32
		at  int64
	}
	var (
		stop      atomic.Bool
		timed     atomic.Bool
		decisions atomic.Int64
		allowed   atomic.Int64
		errs      atomic.Int64
		firstErr  atomic.Value
		wg        sync.WaitGroup
	)
	start := time.Now()
	events := make([][]event, callers)
	for g := range callers {
		ch, err := keydist.NewChooser(w.dist, w.keys, 1.1, 42, uint64(g))
		if err != nil {
			return rpdoc.Cell{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev := make([]event, 0, 4096)
			for !stop.Load() {
				id := ch.Next()
				key := "client-" + strconv.Itoa(id) // built per request
				ok, err := l.Allow(ctx, key)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				if ok {
					ev = append(ev, event{int32(id), time.Since(start).Nanoseconds()})
				}
				if timed.Load() {
					decisions.Add(1)
					if ok {
						allowed.Add(1)
					}
				}
			}
			events[g] = ev
		}()
	}
	time.Sleep(300 * time.Millisecond) // warm-up: connections, scripts
	cpu0, cmd0, err := serverStats(ctx, admin)
	if err != nil {
		stop.Store(true)
		wg.Wait()
		return rpdoc.Cell{}, err
	}
	t0 := time.Now()
	rt0 := trips()
	timed.Store(true)
	time.Sleep(dur)
	timed.Store(false)
	rt1 := trips()
	elapsed := time.Since(t0)
	cpu1, cmd1, err := serverStats(ctx, admin)
	stop.Store(true)
	wg.Wait()
	if err != nil {
		return rpdoc.Cell{}, err
	}
	c := rpdoc.Cell{Peer: p.name, Algorithm: p.algorithm, Deployment: d.name, Workload: w.name,
		Decisions: decisions.Load(), Allowed: allowed.Load(), Errors: errs.Load()}
	if c.Decisions > 0 {
		c.PerSecond = float64(c.Decisions) / elapsed.Seconds()
		c.RedisCPUus = (cpu1 - cpu0) * 1e6 / float64(c.Decisions)
		c.Commands = float64(cmd1-cmd0) / float64(c.Decisions)
		c.RoundTrips = float64(rt1-rt0) / float64(c.Decisions)
	}
	if e, ok := firstErr.Load().(string); ok && c.Decisions == 0 {
		return c, fmt.Errorf("no decision, %d errors, the first: %s", c.Errors, e)
	}
	// The most any key had admitted in one window (t-W, t], over the
	// whole run, warm-up included.
	byKey := map[int32][]int64{}
	for _, ev := range events {
		for _, e := range ev {
			byKey[e.key] = append(byKey[e.key], e.at)
		}
	}
	w64 := window.Nanoseconds()
	for _, ts := range byKey {
		sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
		lo := 0
		for hi := range ts {
			for ts[hi]-ts[lo] >= w64 {
				lo++
			}
			c.MostInWindow = max(c.MostInWindow, hi-lo+1)
		}
	}
	return c, nil
}

// serverStats sums used CPU (seconds) and commands processed over nodes.
func serverStats(ctx context.Context, nodes []*redis.Client) (cpu float64, cmds int64, err error) {
	for _, n := range nodes {
		info, err := n.Info(ctx, "cpu", "stats").Result()
		if err != nil {
			return 0, 0, err
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			switch k {
			case "used_cpu_sys", "used_cpu_user":
				f, _ := strconv.ParseFloat(v, 64)
				cpu += f
			case "total_commands_processed":
				i, _ := strconv.ParseInt(v, 10, 64)
				cmds += i
			}
		}
	}
	return cpu, cmds, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func report(w io.Writer, cells []rpdoc.Cell, ps []peer, dl []deployment, wl []workload, set settings) {
	limit := set.limit
	fmt.Fprintf(w, "Redis limiters side by side: L = %d per %v, %d callers, %v per cell, %d rounds (medians; most in a window: the largest of the rounds).\n\n",
		limit, set.window, set.callers, set.duration, set.rounds)
	for _, d := range dl {
		for _, wk := range wl {
			fmt.Fprintf(w, "### %s, %s\n\n", d.name, wk.name)
			fmt.Fprintln(w, "| limiter | algorithm | decisions/s | × slidegate's | Redis CPU µs/decision | Redis commands/decision (scripts' calls included) | round trips/decision | most admitted in a window | errors |")
			fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
			var base float64
			for _, p := range ps {
				rate, cpu, cmds, rts, most, errs := summary(cells, p.name, d.name, wk.name)
				if p.name == "slidegate" {
					base = rate
				}
				ratio := "—"
				if base > 0 && p.name != "slidegate" {
					ratio = fmt.Sprintf("%.2f", rate/base)
				}
				over := ""
				if most > limit {
					over = " (over L)"
				}
				fmt.Fprintf(w, "| %s | %s | %.0f | %s | %.2f | %.2f | %.2f | %d%s | %d |\n", p.name, p.algorithm, rate, ratio, cpu, cmds, rts, most, over, errs)
			}
			fmt.Fprintln(w)
		}
	}
}

func summary(cells []rpdoc.Cell, peer, dep, wl string) (rate, cpu, cmds, rts float64, most int, errs int64) {
	var rs, cs, ms, ts []float64
	for _, c := range cells {
		if c.Peer != peer || c.Deployment != dep || c.Workload != wl {
			continue
		}
		rs = append(rs, c.PerSecond)
		cs = append(cs, c.RedisCPUus)
		ms = append(ms, c.Commands)
		ts = append(ts, c.RoundTrips)
		most = max(most, c.MostInWindow)
		errs += c.Errors
	}
	return median(rs), median(cs), median(ms), median(ts), most, errs
}
