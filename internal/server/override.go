package server

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/slidegate/slidegate/httplimit"
	"github.com/slidegate/slidegate/internal/server/config"
)

// MethodOverrideHeaders are the request headers through which frameworks
// let a request name the method the application runs instead of its own:
// X-HTTP-Method-Override (Rails, Laravel, Symfony, ASP.NET Core, Express's
// method-override), X-HTTP-Method (OData, ASP.NET Web API) and
// X-Method-Override (Rack and Express configurations). The gateway drops
// them before the upstream (DefaultDropHeaders), so the upstream runs the
// method that was counted. /v1/check, whose proxy forwards them, counts
// the request as each method they name besides its own.
var MethodOverrideHeaders = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// MethodOverrideParam is the query parameter Laravel (by default),
// Symfony and Express (when configured) read as the method to run. The
// gateway and /v1/check count a request carrying it as each method it
// names besides the request's own. The same name in a form body (Rails,
// Laravel, Symfony, Spring) is not read: see docs/operations.md.
const MethodOverrideParam = "_method"

// MaxOverrideMethods bounds the distinct methods one request may name
// through MethodOverrideHeaders and MethodOverrideParam; a request naming
// more is answered 400.
const MaxOverrideMethods = 4

var errTooManyOverrides = fmt.Errorf("the request names more than %d methods to run as (%s, %s)", MaxOverrideMethods, strings.Join(MethodOverrideHeaders, ", "), MethodOverrideParam)

// overrideMethods returns the methods, other than r's own, that r asks
// the application to run it as: the values of MethodOverrideHeaders (when
// headers is set) and of the MethodOverrideParam query parameter, upper-
// cased as frameworks do, each once. A value that is not a method name is
// skipped: no framework runs it. Most requests carry neither, and pay
// three map lookups and a substring search.
func overrideMethods(r *http.Request, headers bool) ([]string, error) {
	var out []string
	add := func(v string) {
		m := strings.ToUpper(strings.TrimSpace(v))
		if m != "" && m != strings.ToUpper(r.Method) && config.MethodName.MatchString(m) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if headers {
		for _, h := range MethodOverrideHeaders {
			for _, v := range r.Header[h] {
				add(v)
			}
		}
	}
	if strings.Contains(r.URL.RawQuery, MethodOverrideParam) {
		q, _ := url.ParseQuery(r.URL.RawQuery) // what parses, as frameworks read it
		for _, v := range q[MethodOverrideParam] {
			add(v)
		}
	}
	if len(out) > MaxOverrideMethods {
		return nil, errTooManyOverrides
	}
	return out, nil
}

// decideOverridden decides r, which names the methods ms besides its own,
// against the limits of each method's route (the top level's for a
// method that matches no route), each list once, one after the other:
// the named methods first, r's own last. It hands r to next when all
// allow. A refusal by a later list leaves the earlier ones charged: the
// application may run such a request as either method, and counting it
// under both is the safe side. fallback is the top level's middleware.
func (s *Server) decideOverridden(w http.ResponseWriter, r *http.Request, st *state, ms []string, fallback *httplimit.Middleware, next http.Handler) {
	type step struct {
		method string
		mw     *httplimit.Middleware
	}
	steps := make([]step, 0, 1+len(ms))
	for _, m := range append(ms, r.Method) {
		mw := fallback
		if x := st.routes.match(asMethod(r, m)); x != nil {
			mw = x.mw
		}
		if !slices.ContainsFunc(steps, func(sp step) bool { return sp.mw == mw }) {
			steps = append(steps, step{m, mw})
		}
	}
	orig := r.Method
	h := next
	for i := len(steps) - 1; i >= 0; i-- {
		inner, sp := h, steps[i]
		decided := sp.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(w, asMethod(r, orig))
		}))
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			decided.ServeHTTP(w, asMethod(r, sp.method))
		})
	}
	h.ServeHTTP(w, r)
}

// asMethod returns r with method m: r itself when it has it, else a
// shallow copy.
func asMethod(r *http.Request, m string) *http.Request {
	if r.Method == m {
		return r
	}
	c := r.WithContext(r.Context())
	c.Method = m
	return c
}
