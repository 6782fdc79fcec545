package main

import (
	"strings"
	"testing"
	"time"

	ebdoc "github.com/slidegate/slidegate/internal/envoybenchdoc"
)

// TestFiguresAndTable: a variant's rounds add up (decisions, seconds,
// CPU, commands), its percentiles are the rounds' medians, and the
// table's row shows slidegate's figures over the peer's.
func TestFiguresAndTable(t *testing.T) {
	round := func(decisions int, secs float64, p50, p99 time.Duration, svc, red time.Duration, fcalls int64) result {
		return result{decisions: decisions, seconds: secs, p50: p50, p99: p99, svcCPU: svc, redCPU: red, redSys: red / 4, errors: 1, fallbacks: 2,
			cmds: map[string]int64{"fcall": fcalls, "time": fcalls}, cmdUs: map[string]int64{"fcall": 3 * fcalls}}
	}
	s := figures([]result{
		round(1000, 1, 2*time.Millisecond, 9*time.Millisecond, 50*time.Millisecond, 20*time.Millisecond, 1000),
		round(3000, 1, 1*time.Millisecond, 5*time.Millisecond, 150*time.Millisecond, 60*time.Millisecond, 3000),
		round(2000, 2, 3*time.Millisecond, 7*time.Millisecond, 100*time.Millisecond, 40*time.Millisecond, 2000),
	})
	if s.Decisions != 6000 || s.Seconds != 4 || s.PerSecond != 1500 || s.Errors != 3 || s.Fallbacks != 6 {
		t.Errorf("totals: %+v", s)
	}
	if s.P50Ns != int64(2*time.Millisecond) || s.P99Ns != int64(7*time.Millisecond) {
		t.Errorf("p50 %d, p99 %d: want the rounds' medians 2 ms and 7 ms", s.P50Ns, s.P99Ns)
	}
	if s.ServiceCPUus != 50 || s.RedisCPUus != 20 || s.RedisSysUs != 5 || s.Commands["fcall"] != 1 || s.Commands["time"] != 1 || s.CommandUs["fcall"] != 3 {
		t.Errorf("per decision: service %v µs, Redis %v µs (system %v), commands %v, µs %v", s.ServiceCPUus, s.RedisCPUus, s.RedisSysUs, s.Commands, s.CommandUs)
	}
	p := ebdoc.Figures{PerSecond: 1000, P50Ns: 4e6, P99Ns: 1e7, ServiceCPUus: 100, RedisCPUus: 10, RedisSysUs: 6, Commands: map[string]float64{"incrby": 3, "expire": 3, "del": 0.04}}
	got := table([]ebdoc.Variant{{Name: "3 desc, mostly allowed, 16 callers", Peer: p, Slidegate: s}})
	row := "| 3 desc, mostly allowed, 16 callers | 1000 / 1500 (1.50) | 4.0 / 2.0 | 10.0 / 7.0 | 100.0 / 50.0 (0.50) | 10.0 / 20.0 (2.00) | 6.0 / 5.0 | EXPIRE 3.0, INCRBY 3.0 / FCALL 1.0, TIME 1.0 |\n"
	if lines := strings.SplitAfter(got, "\n"); len(lines) != 4 || lines[2] != row {
		t.Errorf("table:\n%s\nwant the row\n%s", got, row)
	}
}
