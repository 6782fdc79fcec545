package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
)

// Redis Functions (Redis 7.0 and later): every script of the package is
// also a function of one library, loaded once per master with FUNCTION
// LOAD, and a decision is one FCALL. The library runs the shared prelude
// (luaPrelude) once, when it loads: under EVALSHA every call runs it
// again, which makes its thirty-odd closures and costs more Redis CPU than
// the commands of a refusal. The library's name and its functions' names
// carry a hash of its text, so stores of different versions can share a
// server. Where FUNCTION is refused (Redis 6.2, an ACL, a managed service
// that forbids it) the store runs EVALSHA instead; an FCALL that finds no
// library (a restart without persistence, FUNCTION FLUSH, a new master
// that never had it) ran nothing, so that call goes by EVALSHA and the
// health check loads the library again.

// allScripts lists every script made by newScript, in order: the
// library's functions.
var allScripts []*script

// preludeRC is the line of luaPrelude that binds the library functions
// a decision calls most, which the library replaces: a library cannot
// read them while it loads.
const preludeRC = "local RC, SP, SU, SS, SF, MF = redis.call, struct.pack, struct.unpack, string.sub, string.format, math.floor\n"

// bindRC is what a function of the library runs first in place of
// preludeRC: the globals of preludeRC exist once it runs.
const bindRC = "RC, SP, SU, SS, SF, MF = redis.call, struct.pack, struct.unpack, string.sub, string.format, math.floor\n"

// functionsOff makes stores opened while it is set run EVALSHA even where
// Functions work. Tests set it from SLIDEGATE_REDIS_EVALSHA, to run the
// suites on both paths.
var functionsOff bool

var lib struct {
	once sync.Once
	name string // the library's name
	text string // its FUNCTION LOAD source
}

// library returns the library's name and source, made once all scripts
// are registered (at package initialization).
func library() (name, text string) {
	lib.once.Do(func() {
		var b strings.Builder
		b.WriteString(strings.Replace(luaPrelude, preludeRC, "local RC, SP, SU, SS, SF, MF\n", 1))
		for i, s := range allScripts {
			// TREAL, BMK and LON are the prelude's, which under EVALSHA
			// every call starts afresh: a function resets them. The
			// globals of preludeRC do not exist while the library loads:
			// a function binds them (bindRC).
			if s.flags == "" {
				b.WriteString("\nredis.register_function('sgFN_" + strconv.Itoa(i) + "', function(KEYS, ARGV)\n" + bindRC + "TREAL = -1\nBMK = false\nLON = false\n")
				b.WriteString(s.fbody)
				b.WriteString("\nend)\n")
				continue
			}
			b.WriteString("\nredis.register_function{function_name='sgFN_" + strconv.Itoa(i) + "', callback=function(KEYS, ARGV)\n" + bindRC + "TREAL = -1\nBMK = false\nLON = false\n")
			b.WriteString(s.fbody)
			b.WriteString("\nend, flags={'" + s.flags + "'}}\n")
		}
		sum := sha1.Sum([]byte(b.String()))
		h := hex.EncodeToString(sum[:8])
		lib.name = "slidegate_" + h
		body := strings.ReplaceAll(b.String(), "'sgFN_", "'sg"+h+"_")
		lib.text = "#!lua name=" + lib.name + "\n" + body
		for i, s := range allScripts {
			s.fn = "sg" + h + "_" + strconv.Itoa(i)
		}
	})
	return lib.name, lib.text
}

// fnName returns the script's function in the library.
func (s *script) fnName() string {
	library()
	return s.fn
}

// isNoFunction reports whether err is FCALL's reply for a function the
// server does not have.
func isNoFunction(err error) bool {
	return isServerErr(err) && strings.Contains(err.Error(), "Function not found")
}

// functionConn is a conn that can run the scripts as Redis Functions.
type functionConn interface {
	// loadFunctions loads the library on the master at addr. refused:
	// the server will not run Functions (Redis before 7.0, an ACL); err:
	// it could not be asked.
	loadFunctions(ctx context.Context, addr string) (refused bool, err error)
	// useFunctions switches FCALL on or off.
	useFunctions(on bool)
	// functionsLost reports, and clears, whether an FCALL found no
	// library since the last call.
	functionsLost() bool
	// functions reports whether calls go by FCALL.
	functions() bool
	// onLost sets what an FCALL that found no library calls.
	onLost(f func())
	// fcallDenied reports whether the server refused an FCALL (an ACL
	// that allows FUNCTION LOAD but not FCALL).
	fcallDenied() bool
}

// loadFunctions loads the library on every master when the store has not
// loaded it yet or a call found it missing: FCALL then decides, where
// every master accepts it. A master that refuses Functions turns the
// store to EVALSHA for good; one that cannot be reached leaves things as
// they are until the next health check.
func (s *Store) loadFunctions(ctx context.Context, first bool) {
	fc, ok := s.conn.(functionConn)
	if !ok || s.fnOff || s.fnRefused {
		return
	}
	if !first && !fc.functionsLost() && fc.functions() {
		return
	}
	if fc.fcallDenied() {
		s.fnRefused = true
		fc.useFunctions(false)
		s.cfg.logger.Info("redisstore: FCALL refused: scripts run by EVALSHA", "store", s.name)
		return
	}
	for _, n := range s.topo.Load().nodes {
		refused, err := fc.loadFunctions(ctx, n.addr)
		if refused {
			s.fnRefused = true
			fc.useFunctions(false)
			s.cfg.logger.Info("redisstore: Redis Functions refused: scripts run by EVALSHA",
				"node", n.addr, "cause", err, "store", s.name)
			return
		}
		if err != nil {
			return
		}
	}
	fc.useFunctions(true)
}

// loadFunctions implements functionConn.
func (r *rueidisConn) loadFunctions(ctx context.Context, addr string) (bool, error) {
	_, text := library()
	_, err := r.do(ctx, addr, "FUNCTION", "LOAD", text)
	if err == nil || (isServerErr(err) && strings.Contains(err.Error(), "already exists")) {
		return false, nil
	}
	return isServerErr(err), err
}

func (r *rueidisConn) useFunctions(on bool) { r.fn.Store(on) }

func (r *rueidisConn) functionsLost() bool { return r.lost.Swap(false) }

func (r *rueidisConn) functions() bool { return r.fn.Load() }

func (r *rueidisConn) onLost(f func()) { r.kick = f }

func (r *rueidisConn) fcallDenied() bool { return r.denied.Load() }

// fcallFailed reports whether an FCALL's err says that it ran nothing and
// EVALSHA should decide instead: the server has no library (the health
// check loads it again), or refuses FCALL (NOPERM: the store turns to
// EVALSHA for good).
func (r *rueidisConn) fcallFailed(err error) bool {
	switch {
	case isNoFunction(err):
		r.lost.Store(true)
	case isServerErr(err) && strings.HasPrefix(err.Error(), "NOPERM"):
		r.denied.Store(true)
		r.fn.Store(false)
	default:
		return false
	}
	if r.kick != nil {
		r.kick()
	}
	return true
}
