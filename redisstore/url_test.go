package redisstore

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestParseURL checks every URL form docs/distributed.md lists against
// what rueidis makes of it.
func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		url       string
		kind      kind
		tls       bool
		addrs     []string
		user, pw  string
		db        int
		masterSet string
		server    string // TLS server name
	}{
		{url: "redis://h", addrs: []string{"h:6379"}},
		{url: "redis://h:7000/2", addrs: []string{"h:7000"}, db: 2},
		{url: "redis://u:p%40ss@h:7000/0", addrs: []string{"h:7000"}, user: "u", pw: "p@ss"},
		{url: "redis://secret@h", addrs: []string{"h:6379"}, pw: "secret"},
		{url: "redis://[::1]:7000", addrs: []string{"[::1]:7000"}},
		{url: "redis://h:1?db=3&client_name=gw", addrs: []string{"h:1"}, db: 3},
		{url: "rediss://:pw@cache.example.com:6380", tls: true, addrs: []string{"cache.example.com:6380"}, pw: "pw", server: "cache.example.com"},
		{url: "unix:///run/redis/redis.sock", addrs: []string{"/run/redis/redis.sock"}},
		{url: "unix://:pw@/run/redis.sock?db=4", addrs: []string{"/run/redis.sock"}, pw: "pw", db: 4},
		{url: "redis-cluster://a:1,b:2,c:3", kind: cluster, addrs: []string{"a:1", "b:2", "c:3"}},
		{url: "rediss-cluster://u:p@a:1,b:2", kind: cluster, tls: true, addrs: []string{"a:1", "b:2"}, user: "u", pw: "p"},
		{url: "redis-sentinel://s1:26379,s2:26379/1?master_set=mymaster", kind: sentinel, addrs: []string{"s1:26379", "s2:26379"}, db: 1, masterSet: "mymaster"},
		{url: "rediss-sentinel://:pw@s1:26379?master_set=m", kind: sentinel, tls: true, addrs: []string{"s1:26379"}, pw: "pw", masterSet: "m"},
		{url: "redis://s1:26379?master_set=m&addr=s2:26379", kind: sentinel, addrs: []string{"s1:26379", "s2:26379"}, masterSet: "m"},
		{url: "valkey://h:7000/2", addrs: []string{"h:7000"}, db: 2},
		{url: "valkeys://:pw@cache.example.com:6380", tls: true, addrs: []string{"cache.example.com:6380"}, pw: "pw", server: "cache.example.com"},
		{url: "valkey-cluster://a:1,b:2,c:3", kind: cluster, addrs: []string{"a:1", "b:2", "c:3"}},
		{url: "valkeys-cluster://u:p@a:1,b:2", kind: cluster, tls: true, addrs: []string{"a:1", "b:2"}, user: "u", pw: "p"},
		{url: "valkey-sentinel://s1:26379,s2:26379/1?master_set=mymaster", kind: sentinel, addrs: []string{"s1:26379", "s2:26379"}, db: 1, masterSet: "mymaster"},
		{url: "valkeys-sentinel://:pw@s1:26379?master_set=m", kind: sentinel, tls: true, addrs: []string{"s1:26379"}, pw: "pw", masterSet: "m"},
	} {
		tg, err := parseURL(c.url)
		if err != nil {
			t.Errorf("%s: %v", c.url, err)
			continue
		}
		o := tg.opt
		server := ""
		if o.TLSConfig != nil {
			server = o.TLSConfig.ServerName
		}
		if tg.kind != c.kind || tg.tls != c.tls || (o.TLSConfig != nil) != c.tls || !slices.Equal(o.InitAddress, c.addrs) ||
			o.Username != c.user || o.Password != c.pw || o.SelectDB != c.db || o.Sentinel.MasterSet != c.masterSet || server != c.server {
			t.Errorf("%s: kind %d tls %v addrs %v user %q password %q db %d master_set %q server name %q; want %+v",
				c.url, tg.kind, tg.tls, o.InitAddress, o.Username, o.Password, o.SelectDB, o.Sentinel.MasterSet, server, c)
		}
	}
}

// TestURLErrorsHidePasswords: no error about a URL shows its password,
// whatever part of the URL is wrong.
func TestURLErrorsHidePasswords(t *testing.T) {
	for _, u := range []string{
		"redis://:hunter2@h:port", "redis://u:hunter2@h:1/x", "redis://:hunter2@h:1?bogus=1",
		"rediss://:hunter2@h:1/1/2", "redis-cluster://:hunter2@a:1,,b:2", "redis-sentinel://:hunter2@a:1",
		"redis://:hunter2@h%zz:1", "redis://:hunter2@a:1,b:2", "redis-cluster://:hunter2@a:1/3",
		"ftp://:hunter2@h", "redis://:hunter2@h:1?db=x", "redis://:hunter2@h:1#frag",
	} {
		_, err := parseURL(u)
		if !errors.Is(err, ErrInvalidURL) {
			t.Errorf("%s: %v, want ErrInvalidURL", u, err)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the password: %v", u, err)
		}
	}
}
