package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Hurry moves a drain in progress (Run after its context ended) to its
// next stage at once: during the drain delay it ends the delay, so the
// listeners close now; once they are closed, it stops waiting for
// in-flight requests and cuts them off. slidegate serve calls it on each
// SIGINT or SIGTERM after the first. A call before Run's context ends
// skips the coming delay.
func (s *Server) Hurry() {
	select {
	case s.hurry <- struct{}{}:
	default: // one is pending already
	}
}

// Shutdown stops accepting connections, waits for in-flight requests until
// ctx ends, then closes the backends (stopping their sweepers). It returns
// ctx's error if requests were still running when it ended (they are then
// cut off). Shutdown is safe to call more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.ready.Store(false)
	s.mu.Lock()
	srv, adminSrv, started := s.srv, s.adminSrv, s.started
	s.stopped = true
	s.mu.Unlock()
	var errs []error
	if started {
		if srv != nil {
			if err := srv.Shutdown(ctx); err != nil {
				errs = append(errs, err)
				_ = srv.Close()
			}
		}
		if adminSrv != nil {
			if err := adminSrv.Shutdown(ctx); err != nil {
				_ = adminSrv.Close()
			}
		}
	}
	s.closeBackends()
	return errors.Join(errs...)
}

// Close stops everything at once, cutting off in-flight requests.
func (s *Server) Close() error {
	s.ready.Store(false)
	s.mu.Lock()
	srv, adminSrv := s.srv, s.adminSrv
	s.stopped = true
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	if adminSrv != nil {
		_ = adminSrv.Close()
	}
	s.closeBackends()
	return nil
}

func (s *Server) closeBackends() {
	s.closeOnce.Do(func() {
		s.reload.Lock() // no reload after this
		defer s.reload.Unlock()
		s.tr.CloseIdleConnections()
		st := s.cur.Load()
		s.closeState(st, st.policies)
		s.retired.Wait()
		s.flood.Close()
		if s.top != nil {
			s.top.Close()
		}
	})
}

// Run starts the server, serves until ctx is done (for slidegate serve:
// SIGINT or SIGTERM), then drains: /readyz answers 503 for DrainDelay
// while requests are still served, so that load balancers stop sending;
// then the listeners close and in-flight requests get ShutdownTimeout to
// finish. Hurry cuts both waits short. It returns nil after a clean
// shutdown.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		s.closeBackends()
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-s.serveErr:
		if errors.Is(err, http.ErrServerClosed) {
			return nil // Shutdown or Close was called directly
		}
		_ = s.Close()
		return fmt.Errorf("server: %w", err)
	}
	s.ready.Store(false)
	// From now on every response says Connection: close, so that a client
	// that keeps sending has no idle keep-alive connection left when the
	// listeners close (a request sent on one as the server closes it fails
	// with EOF or a reset). Not SetKeepAlivesEnabled(false): it closes the
	// idle connections at once, racing the requests clients are sending
	// on them.
	s.draining.Store(true)
	if d := *s.cfg.DrainDelay; d > 0 {
		s.log.Info("draining: /readyz answers 503; listeners close after the drain delay", "drain_delay", d.String())
		t := time.NewTimer(time.Duration(d))
		select {
		case <-t.C:
		case <-s.hurry:
			t.Stop()
			s.log.Info("drain cut short")
		}
	} else {
		select {
		case <-s.hurry: // the delay it would have ended is empty
		default:
		}
	}
	s.log.Info("shutting down", "timeout", s.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), time.Duration(s.cfg.ShutdownTimeout))
	defer cancel()
	go func() {
		select {
		case <-s.hurry:
			s.log.Info("no longer waiting for in-flight requests: cutting them off")
			cancel()
		case <-sctx.Done():
		}
	}()
	if err := s.Shutdown(sctx); err != nil {
		return fmt.Errorf("server: shutdown: %w", err)
	}
	s.log.Info("stopped")
	return nil
}
