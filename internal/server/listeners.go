package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/slidegate/slidegate/internal/connlimit"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/redact"
	"github.com/slidegate/slidegate/internal/server/config"
)

// Start listens on the configured addresses and serves in the background.
// Addr and AdminAddr then return the bound addresses (useful with port 0).
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.stopped {
		return errors.New("server: already started")
	}
	var lis, adminLis net.Listener
	var err error
	if s.cfg.Listen != "off" {
		if lis, err = net.Listen("tcp", s.cfg.Listen); err != nil {
			return fmt.Errorf("%w: listen: %w", config.ErrConfig, err)
		}
	}
	if s.cfg.Admin != "off" {
		if adminLis, err = net.Listen("tcp", s.cfg.Admin); err != nil {
			if lis != nil {
				_ = lis.Close()
			}
			return fmt.Errorf("%w: admin: %w", config.ErrConfig, err)
		}
	}
	s.started = true
	s.lis, s.adminLis = lis, adminLis
	headerTimeout := min(s.cfg.ReadHeaderTimeout, s.cfg.ReadTimeout)
	s.serveErr = make(chan error, 2)
	if lis != nil {
		s.startMain(lis, s.connErrorLog("main"), headerTimeout)
	}
	if adminLis != nil {
		s.startAdmin(adminLis, s.connErrorLog("admin"), headerTimeout)
	}
	s.ready.Store(true)
	st := s.cur.Load()
	mode := "decision API"
	if st.cfg.Upstream != "" {
		mode = "gateway to " + redact.URLs(string(st.cfg.Upstream))
	}
	listen := "off"
	if lis != nil {
		listen = lis.Addr().String()
	}
	s.log.Info("slidegate serving", "listen", listen, "admin", s.adminAddrLocked(), "mode", mode,
		"store", redact.URLs(s.cfg.Store), "policies", len(st.policies), "default_policy", st.def.name, "tls", s.certs != nil)
	return nil
}

// startMain serves the decision API or gateway on lis; s.mu is held.
func (s *Server) startMain(lis net.Listener, errLog *log.Logger, headerTimeout config.Duration) {
	proxies, _ := httpkit.ParsePrefixes(s.cur.Load().cfg.TrustedProxies)
	s.connLis = connlimit.New(lis, connlimit.Config{
		MaxConns: int(s.cfg.MaxConns), MaxPerAddr: int(s.cfg.MaxConnsPerIP), IPv6Prefix: int(s.cfg.IPv6Prefix),
		Exempt: exemptProxies(proxies), OnClose: s.metrics.connClosed("main"),
	})
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: time.Duration(headerTimeout),
		ReadTimeout:       time.Duration(s.cfg.ReadTimeout),
		WriteTimeout:      time.Duration(s.cfg.WriteTimeout),
		IdleTimeout:       time.Duration(s.cfg.IdleTimeout),
		MaxHeaderBytes:    int(s.cfg.MaxHeaderBytes),
		ErrorLog:          errLog,
	}
	count := s.metrics.connState("main")
	s.srv.ConnState = func(c net.Conn, st http.ConnState) {
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn() // the connection limiter's own
		}
		s.connLis.ConnState(c, st)
		count(c, st)
	}
	var serveLis net.Listener = s.connLis
	if s.certs != nil {
		serveLis = tls.NewListener(s.connLis, s.certs.ServerConfig("h2", "http/1.1"))
	}
	go func() { s.serveErr <- s.srv.Serve(serveLis) }()
}

// startAdmin serves the admin endpoints on adminLis; s.mu is held.
func (s *Server) startAdmin(adminLis net.Listener, errLog *log.Logger, headerTimeout config.Duration) {
	// No write timeout here: /debug/pprof/profile?seconds=30 writes
	// for as long as it was asked to.
	// No cap per address: the admin's clients (Prometheus, an
	// operator on loopback) come from a few addresses.
	al := connlimit.New(adminLis, connlimit.Config{MaxConns: int(s.cfg.MaxConns), OnClose: s.metrics.connClosed("admin")})
	count := s.metrics.connState("admin")
	s.adminSrv = &http.Server{
		Handler:           s.admin,
		ReadHeaderTimeout: time.Duration(headerTimeout),
		ReadTimeout:       time.Duration(s.cfg.ReadTimeout),
		IdleTimeout:       time.Duration(s.cfg.IdleTimeout),
		MaxHeaderBytes:    int(s.cfg.MaxHeaderBytes),
		ErrorLog:          errLog,
		ConnState: func(c net.Conn, st http.ConnState) {
			al.ConnState(c, st)
			count(c, st)
		},
	}
	go func() { s.serveErr <- s.adminSrv.Serve(al) }()
}

// TLSConfig returns a server TLS configuration with the certificate in
// force at each handshake (reread on reload) offering nextProtos, for a
// listener beside the server's (slidegate serve's gRPC listener); nil
// when the configuration has no tls section.
func (s *Server) TLSConfig(nextProtos ...string) *tls.Config {
	if s.certs == nil {
		return nil
	}
	return s.certs.ServerConfig(nextProtos...)
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

// exemptProxies exempts the trusted proxies' addresses from the cap per
// address: each of their connections carries many clients.
func exemptProxies(proxies []netip.Prefix) func(netip.Addr) bool {
	if len(proxies) == 0 {
		return nil
	}
	return func(a netip.Addr) bool { return httpkit.Trusted(proxies, a) }
}
