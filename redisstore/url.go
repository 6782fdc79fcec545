package redisstore

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// ErrInvalidURL is wrapped by every error about a store URL.
var ErrInvalidURL = errors.New("redisstore: invalid store URL")

// defaultPort is the port used when a URL names a host without one.
const defaultPort = "6379"

// target is a parsed store URL.
type target struct {
	cluster            bool
	addrs              []string
	username, password string
	db                 int
}

// parseURL parses
//
//	redis://[user[:password]@]host[:port][/db]
//	redis-cluster://[user[:password]@]host:port[,host:port...]
//
// The database of a redis:// URL is a number from 0 (the default); Redis
// Cluster has only database 0, so redis-cluster:// URLs take no path.
func parseURL(raw string) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, fmt.Errorf("%w %q: %s", ErrInvalidURL, redact(raw), fmt.Sprintf(format, args...))
	}
	var t target
	var rest string
	switch {
	case strings.HasPrefix(raw, "redis://"):
		rest = strings.TrimPrefix(raw, "redis://")
	case strings.HasPrefix(raw, "redis-cluster://"):
		t.cluster = true
		rest = strings.TrimPrefix(raw, "redis-cluster://")
	default:
		return bad("want redis://host:port/db or redis-cluster://host:port,host:port")
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return bad("query strings and fragments are not supported")
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		cred := rest[:i]
		rest = rest[i+1:]
		user, pass, hasPass := strings.Cut(cred, ":")
		var err error
		if t.username, err = url.PathUnescape(user); err != nil {
			return bad("user: %v", err)
		}
		if hasPass {
			if t.password, err = url.PathUnescape(pass); err != nil {
				return bad("password: %v", err)
			}
		} else if t.username != "" {
			// redis://secret@host: a lone credential is a password, as in
			// redis-cli and most clients.
			t.password, t.username = t.username, ""
		}
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if path != "" {
		if t.cluster {
			return bad("Redis Cluster has only database 0; remove %q", "/"+path)
		}
		db, err := strconv.Atoi(path)
		if err != nil || db < 0 {
			return bad("database %q is not a number ≥ 0", path)
		}
		t.db = db
	}
	if hosts == "" {
		return bad("no host")
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return bad("empty host in %q", hosts)
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			if !strings.Contains(h, ":") || strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
				host, port = strings.Trim(h, "[]"), defaultPort
			} else {
				return bad("host %q: %v", h, err)
			}
		}
		if host == "" {
			return bad("host %q has no name", h)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return bad("host %q: port %q is not a number from 1 to 65535", h, port)
		}
		t.addrs = append(t.addrs, net.JoinHostPort(host, port))
	}
	if !t.cluster && len(t.addrs) > 1 {
		return bad("redis:// takes one host; use redis-cluster:// for a cluster")
	}
	return t, nil
}

// redact hides the password of a URL for error messages and logs.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	i := strings.LastIndex(rest, "@")
	if i < 0 {
		return raw
	}
	return scheme + "://xxxxx@" + rest[i+1:]
}
