package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"golang.org/x/net/netutil"

	"github.com/slidegate/slidegate/internal/redact"
)

// Start listens on the configured addresses and serves in the background.
// Addr and AdminAddr then return the bound addresses (useful with port 0).
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("server: already started")
	}
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("%w: listen: %w", ErrConfig, err)
	}
	var adminLis net.Listener
	if s.cfg.Admin != "off" {
		if adminLis, err = net.Listen("tcp", s.cfg.Admin); err != nil {
			_ = lis.Close()
			return fmt.Errorf("%w: admin: %w", ErrConfig, err)
		}
	}
	s.started = true
	s.lis, s.adminLis = lis, adminLis
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.cfg.ReadTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          errLog,
	}
	s.srv.ConnState = s.metrics.connState("main")
	s.serveErr = make(chan error, 2)
	go func() { s.serveErr <- s.srv.Serve(netutil.LimitListener(lis, s.cfg.MaxConns)) }()
	if adminLis != nil {
		// No write timeout here: /debug/pprof/profile?seconds=30 writes
		// for as long as it was asked to.
		s.adminSrv = &http.Server{
			Handler:           s.admin,
			ReadHeaderTimeout: s.cfg.ReadTimeout,
			ReadTimeout:       s.cfg.ReadTimeout,
			IdleTimeout:       s.cfg.IdleTimeout,
			MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
			ErrorLog:          errLog,
			ConnState:         s.metrics.connState("admin"),
		}
		go func() { s.serveErr <- s.adminSrv.Serve(netutil.LimitListener(adminLis, s.cfg.MaxConns)) }()
	}
	s.ready.Store(true)
	st := s.cur.Load()
	mode := "decision API"
	if st.cfg.Upstream != "" {
		mode = "gateway to " + redact.URLs(st.cfg.Upstream)
	}
	s.log.Info("slidegate serving", "listen", lis.Addr().String(), "admin", s.adminAddrLocked(), "mode", mode,
		"store", redact.URLs(s.cfg.Store), "policies", len(st.tiers), "default_policy", st.def.name)
	return nil
}

// Addr returns the main listener's address once started, else "".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return ""
	}
	return s.lis.Addr().String()
}

// AdminAddr returns the admin listener's address once started, else "".
func (s *Server) AdminAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adminAddrLocked()
}

// adminAddrLocked is AdminAddr; s.mu must be held.
func (s *Server) adminAddrLocked() string {
	if s.adminLis == nil {
		return ""
	}
	return s.adminLis.Addr().String()
}
