package redisstore

import (
	"context"
	"errors"
	"fmt"
)

// Ping sends PING to every master the store knows and returns nil when
// at least one answers. A server's error reply is an answer. It is what
// a caller's health check can follow: an error means no master of the
// store could be reached within ctx.
func (s *Store) Ping(ctx context.Context) error {
	var errs []error
	for _, n := range s.topo.Load().nodes {
		_, err := s.conn.do(ctx, n.addr, "PING")
		if err == nil || isServerErr(err) {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.addr, err))
	}
	if len(errs) == 0 {
		return errors.New("redisstore: no master known")
	}
	return errors.Join(errs...)
}
