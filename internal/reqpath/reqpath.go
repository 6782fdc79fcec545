// Package reqpath reads a request's method and path the way the servers
// behind a gateway read them, so that no spelling of a request escapes the
// limit of the route it reaches (the gateway's routes and httplimit's
// route keys share it).
package reqpath

import (
	"path"
	"strings"
)

// Clean returns the decoded URL path p as routes match it: path
// parameters removed (from a ";" to the end of its segment, as Tomcat,
// Jetty and Spring strip them, so "/login;jsessionid=1" and
// "/x/..;/login" are "/login"), cleaned by path.Clean ("//a/./b" is
// "/a/b", "" is "/"), and lower-cased when fold is set.
func Clean(p string, fold bool) string {
	if strings.IndexByte(p, ';') >= 0 {
		p = stripParams(p)
	}
	if p == "" {
		p = "/"
	}
	p = path.Clean(p)
	if fold {
		p = strings.ToLower(p)
	}
	return p
}

// stripParams drops every segment's parameters: each ";" up to the next "/".
func stripParams(p string) string {
	var b strings.Builder
	b.Grow(len(p))
	for p != "" {
		i := strings.IndexByte(p, ';')
		if i < 0 {
			b.WriteString(p)
			break
		}
		b.WriteString(p[:i])
		p = p[i:]
		j := strings.IndexByte(p, '/')
		if j < 0 {
			break
		}
		p = p[j:]
	}
	return b.String()
}

// Method returns the method as a route counts it: HEAD as GET (every
// server that follows RFC 9110 serves HEAD with GET's handler).
func Method(m string) string {
	if m == "HEAD" {
		return "GET"
	}
	return m
}

// Canonical reports whether m is spelt as RFC 9110 methods are: no lower
// case letter. A method is case-sensitive, but Django and Flask serve
// "post" as POST while a route for POST would not match it; nginx answers
// such a request 400, and so does the gateway.
func Canonical(m string) bool {
	for i := 0; i < len(m); i++ {
		if 'a' <= m[i] && m[i] <= 'z' {
			return false
		}
	}
	return true
}
