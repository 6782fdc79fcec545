package redisstore

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/slidegate/slidegate/internal/redisnames"
)

// ErrInvalidURL is wrapped by every error about a store URL.
var ErrInvalidURL = errors.New("redisstore: invalid store URL")

// Deployment kinds a store URL names.
type kind int

const (
	standalone kind = iota
	cluster
	sentinel
)

// target is a parsed store URL: rueidis's options and the deployment.
type target struct {
	kind kind
	tls  bool
	opt  rueidis.ClientOption
}

// urlQueryKeys are the query parameters a store URL may carry, those of
// rueidis.ParseURL that do not change what the package relies on (retries,
// client-side caching and timeouts are the package's own options).
var urlQueryKeys = []string{"addr", "client_name", "db", "master_set", "protocol", "skip_verify"}

// parseURL parses the store URL forms (docs/distributed.md):
//
//	redis://[user[:password]@]host[:port][/db][?master_set=NAME&addr=host:port...]
//	rediss://...                                   (TLS)
//	unix://[user[:password]@]/path/to/socket[?db=N]
//	redis-cluster://[user[:password]@]host:port[,host:port...]
//	rediss-cluster://...                           (TLS)
//	redis-sentinel://[user[:password]@]host:port[,host:port...][/db]?master_set=NAME
//	rediss-sentinel://...                          (TLS)
//
// Each redis scheme has a valkey one (valkey://, valkeys://,
// valkey-cluster://, valkeys-cluster://, valkey-sentinel://,
// valkeys-sentinel://) that means the same: Valkey speaks Redis's
// protocol. The cluster and sentinel forms are rewritten to the redis:// or rediss://
// form rueidis.ParseURL reads (the other hosts as addr parameters), which
// does the parsing. A lone credential (redis://secret@host) is a password,
// as in redis-cli. No error shows the password.
func parseURL(raw string) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, fmt.Errorf("%w %q: %s", ErrInvalidURL, redact(raw), fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return bad("want a URL such as redis://host:port (known schemes: %s)", strings.Join(redisnames.Schemes, ", "))
	}
	var t target
	// A valkey scheme is its redis one.
	norm := scheme
	if v, ok := strings.CutPrefix(scheme, "valkey"); ok {
		norm = "redis" + v
	}
	base := norm
	switch norm {
	case "redis", "unix":
	case "rediss":
		t.tls = true
	case "redis-cluster", "rediss-cluster":
		t.kind = cluster
		t.tls = norm == "rediss-cluster"
		base = strings.TrimSuffix(norm, "-cluster")
	case "redis-sentinel", "rediss-sentinel":
		t.kind = sentinel
		t.tls = norm == "rediss-sentinel"
		base = strings.TrimSuffix(norm, "-sentinel")
	default:
		return bad("unknown scheme %q (known: %s)", scheme, strings.Join(redisnames.Schemes, ", "))
	}
	if strings.Contains(rest, "#") {
		return bad("fragments are not supported")
	}
	// The authority ends at the first "/" or "?" after the credentials.
	at := strings.LastIndex(rest, "@")
	end := len(rest)
	if i := strings.IndexAny(rest[at+1:], "/?"); i >= 0 {
		end = at + 1 + i
	}
	cred, hosts, tail := "", rest[at+1:end], rest[end:]
	if at >= 0 {
		cred = rest[:at+1]
	}
	var extra []string
	if t.kind != standalone {
		list := strings.Split(hosts, ",")
		if slices.Contains(list, "") {
			return bad("empty host in %q", hosts)
		}
		hosts, extra = list[0], list[1:]
	}
	if scheme == "unix" {
		if hosts != "" {
			return bad("unix:// takes a socket path, as in unix:///run/redis.sock")
		}
	} else if err := checkHost(hosts); err != nil {
		return bad("%v", err)
	}
	for _, h := range extra {
		if err := checkHost(h); err != nil {
			return bad("%v", err)
		}
	}
	u, err := url.Parse(base + "://" + cred + hosts + tail)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its URL would show the password
		}
		return bad("%v", err)
	}
	q := u.Query()
	for k := range q {
		if !slices.Contains(urlQueryKeys, k) {
			return bad("unknown query parameter %q (known: %s; timeouts and retries are store options)", k, strings.Join(urlQueryKeys, ", "))
		}
	}
	if t.kind == cluster && (strings.Trim(u.Path, "/") != "" && strings.Trim(u.Path, "/") != "0" || q.Has("db")) {
		return bad("Redis Cluster has only database 0; remove %q", u.Path)
	}
	if t.kind == cluster && q.Has("master_set") {
		return bad("master_set names a Sentinel master; use redis-sentinel://")
	}
	if t.kind == sentinel && q.Get("master_set") == "" {
		return bad("redis-sentinel:// needs ?master_set=NAME, the master's name in the sentinels' configuration")
	}
	for _, h := range q["addr"] {
		if err := checkHost(h); err != nil {
			return bad("addr: %v", err)
		}
	}
	for _, h := range extra {
		q.Add("addr", h)
	}
	if p := strings.Trim(u.Path, "/"); scheme != "unix" && p != "" {
		if db, err := strconv.Atoi(p); err != nil || db < 0 {
			return bad("database %q is not a number ≥ 0", p)
		}
	}
	if v := q.Get("db"); q.Has("db") {
		if db, err := strconv.Atoi(v); err != nil || db < 0 {
			return bad("database %q is not a number ≥ 0", v)
		}
	}
	u.RawQuery = q.Encode()
	opt, err := rueidis.ParseURL(u.String())
	if err != nil {
		return bad("%v", err)
	}
	if u.User != nil {
		if _, hasPass := u.User.Password(); !hasPass && opt.Username != "" {
			// redis://secret@host: a lone credential is a password, as in
			// redis-cli and most clients.
			opt.Password, opt.Username = opt.Username, ""
		}
	}
	if opt.Sentinel.MasterSet != "" {
		t.kind = sentinel
	}
	if t.kind == standalone && len(opt.InitAddress) > 1 {
		return bad("%s:// takes one host; use redis-cluster:// for a cluster or redis-sentinel:// for sentinels", scheme)
	}
	if t.kind != standalone && opt.TLSConfig != nil {
		// Each node's certificate is checked against the name it is
		// dialled by, not the first host's.
		opt.TLSConfig.ServerName = ""
	}
	t.opt = opt
	return t, nil
}

// checkHost checks one host[:port] of a URL: a name and, if given, a port
// from 1 to 65535 (rueidis would quietly dial localhost for an empty one).
func checkHost(h string) error {
	if h == "" {
		return errors.New("no host")
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		if strings.Contains(h, ":") && !(strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]")) {
			return fmt.Errorf("host %q: %v", h, err)
		}
		host, port = strings.Trim(h, "[]"), "6379"
	}
	if host == "" {
		return fmt.Errorf("host %q has no name", h)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("host %q: port %q is not a number from 1 to 65535", h, port)
	}
	return nil
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
