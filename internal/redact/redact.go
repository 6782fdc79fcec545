// Package redact hides the passwords of URLs in text that slidegate logs,
// prints or answers with (the server and slidegate serve share it).
package redact

import "regexp"

// userinfo matches the password of a URL's userinfo, wherever the URL is
// in a string. Like url.Parse, it ends the userinfo at the last @ of the
// authority (which ends at /, ? or #), so that an unescaped @ in the user
// name or the password hides no part of the password.
var userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/?#\s]*:)[^/?#\s]*@`)

// URLs replaces the password of every URL in s by "xxxxx"
// (redis://:secret@host becomes redis://:xxxxx@host), for logs, errors,
// --print-config and /debug/pprof/cmdline.
func URLs(s string) string { return userinfo.ReplaceAllString(s, "${1}xxxxx@") }
