package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/slidegate/slidegate/engine"
)

var _ engine.KeyAdmin = (*Limiter)(nil)

// delScript drops a client's own key (KEYS[1]) and its field (ARGV[1]) in
// its bucket (KEYS[2]) if it has one, and returns {1} if either existed
// (a client's state is in one of them at most), else {0}.
var delScript = newScript(`
local d = redis.call('DEL', KEYS[1])
if KEYS[2] then d = d + redis.call('HDEL', KEYS[2], ARGV[1]) end
return {d}
`)

// InspectKey returns key's state now (Redis TIME, or the store's caller
// clock), and false when Redis holds none for it. It changes nothing. It
// reads the key where Decide keeps it (the key's own slot tag); state kept
// under a tag (DecideTagged, Group.DecideGroup with a Tag) is at TaggedKey.
// Errors are Redis's, unhidden by the failure policy: an operator asked.
func (l *Limiter) InspectKey(ctx context.Context, key string) (engine.KeyState, bool, error) {
	st := l.st
	select {
	case <-st.closed:
		return engine.KeyState{}, false, ErrClosed
	default:
	}
	now := "-1"
	if st.cfg.clock != nil {
		t := st.now()
		if t < 0 {
			return engine.KeyState{}, false, fmt.Errorf("%w: clock reads %d, before its epoch", engine.ErrInvalidInstant, t)
		}
		now = strconv.FormatInt(t/1000, 10)
	}
	cctx, cancel := context.WithTimeout(ctx, st.cfg.timeout)
	defer cancel()
	keys, args := []string{l.Key(key)}, []string{l.group[0], l.args[0], l.args[1], l.args[4], now}
	if b, ok := l.bucketIn(slotOf(key), key); ok {
		keys, args = append(keys, b), append(args, key)
	}
	res, err := st.conn.evalKeys(cctx, inspectScript, keys, args)
	if err == nil && len(res) != 5 {
		err = fmt.Errorf("redisstore: inspect script returned %d values, want 5", len(res))
	}
	if err != nil {
		return engine.KeyState{}, false, fmt.Errorf("redisstore: inspecting a key: %w", err)
	}
	if res[0] == 0 {
		return engine.KeyState{}, false, nil
	}
	ks := engine.KeyState{
		Used:      l.policy.Limit - int(res[1]),
		Remaining: int(res[1]),
		Reset:     time.Duration(res[3]) * time.Microsecond,
		At:        res[4] * 1000,
	}
	if res[2] >= 0 && ks.Used > 0 {
		ks.Oldest = time.Duration(res[4]-res[2]) * time.Microsecond
	}
	return ks, true, nil
}

// ResetKey drops key's state in Redis (where Decide keeps it, as for
// InspectKey), and this limiter's cached refusal of it, and reports
// whether Redis held any: the client's next request is decided as a new
// key's. Other replicas' refusal caches may still refuse it locally until
// the RetryAfter they cached has passed.
func (l *Limiter) ResetKey(ctx context.Context, key string) (bool, error) {
	st := l.st
	select {
	case <-st.closed:
		return false, ErrClosed
	default:
	}
	cctx, cancel := context.WithTimeout(ctx, st.cfg.timeout)
	defer cancel()
	keys, args := []string{l.Key(key)}, []string(nil)
	if b, ok := l.bucketIn(slotOf(key), key); ok {
		keys, args = append(keys, b), []string{key}
	}
	res, err := st.conn.evalKeys(cctx, delScript, keys, args)
	if err == nil && len(res) != 1 {
		err = fmt.Errorf("redisstore: delete script returned %d values, want 1", len(res))
	}
	if err != nil {
		return false, fmt.Errorf("redisstore: resetting a key: %w", err)
	}
	if l.cache != nil {
		l.cache.drop(key)
	}
	return res[0] == 1, nil
}
