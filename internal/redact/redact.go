// Package redact hides the secrets slidegate would otherwise log, print
// or answer with: the passwords of URLs, and client keys (the server and
// slidegate serve share it).
package redact

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"regexp"
	"strings"
)

// userinfo matches the password of a URL's userinfo, wherever the URL is
// in a string. Like url.Parse, it ends the userinfo at the last @ of the
// authority (which ends at /, ? or #), so that an unescaped @ in the user
// name or the password hides no part of the password.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/?#\s]*:)[^/?#\s]*@`)

// scheme finds where each URL in a string starts.
var scheme = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://`)

// URLs replaces the password of every URL in s by "xxxxx"
// (redis://:secret@host becomes redis://:xxxxx@host), for logs, errors,
// --print-config and /debug/pprof/cmdline.
//
// A URL that does not parse (a base64 password holds /, +, and people
// paste #, spaces and quotes), or whose path holds an @, has no authority
// to go by: then everything
// from just after its "scheme://" (or after the first ":" there) to the
// last @ before the next URL or the end of s is hidden. That hides too
// much rather than too little when an @ follows the URL in the text.
func URLs(s string) string {
	locs := scheme.FindAllStringIndex(s, -1)
	if locs == nil {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:locs[0][0]])
	for i, loc := range locs {
		end := len(s)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		b.WriteString(oneURL(s[loc[0]:end], loc[1]-loc[0]))
	}
	return b.String()
}

// oneURL redacts the URL at the start of seg, which runs to the next URL
// or the end of the text; n is the length of its "scheme://".
func oneURL(seg string, n int) string {
	tok := seg
	if i := strings.IndexAny(seg, " \t\r\n\"'`<>"); i >= 0 {
		tok = seg[:i]
	}
	// A path holding an @ is taken for a password holding a /
	// ("redis://u:1234/x@host" parses as host u:1234, path /x@host).
	if u, err := url.Parse(strings.TrimRight(tok, ".,;)]}")); err == nil && (u.User != nil || !strings.Contains(u.Path, "@")) {
		return userinfo.ReplaceAllString(seg, "${1}xxxxx@")
	}
	at := strings.LastIndexByte(seg, '@')
	if at < n {
		return userinfo.ReplaceAllString(seg, "${1}xxxxx@")
	}
	start := n
	if c := strings.IndexByte(seg[n:at], ':'); c >= 0 {
		start = n + c + 1
	}
	return seg[:start] + "xxxxx" + seg[at:]
}

// Key stands for a client key in logs: an API key is a credential, so the
// log gets "sha256:" and the first 16 hex digits of its SHA-256 (64 bits:
// enough to tell keys apart and to find one's lines by hashing it, nothing
// to send as a key).
func Key(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// Secret reports whether an option named name holds a credential: its
// name says password, secret, token or passphrase (any case). Such a
// value is printed as "xxxxx".
func Secret(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"password", "passwd", "secret", "token", "passphrase", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// Options returns a copy of m, a store's free-form options, for printing:
// the value of every Secret name becomes "xxxxx" (an empty one stays
// empty, to show it is unset), and URLs in the other strings lose their
// passwords. Nested maps and lists are handled the same way. m is not
// changed.
func Options(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = optionValue(Secret(k), v)
	}
	return out
}

func optionValue(secret bool, v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		if secret && x != "" {
			return "xxxxx"
		}
		return URLs(x)
	case map[string]any:
		if secret {
			return "xxxxx"
		}
		return Options(x)
	case []any:
		if secret {
			return "xxxxx"
		}
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = optionValue(false, e)
		}
		return l
	default:
		if secret {
			return "xxxxx"
		}
		return v
	}
}
