package server

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/httpkit"
	"github.com/slidegate/slidegate/internal/server/config"
)

// policy is one policy in force: its backend, header writer and metrics. index is
// its place in the configuration's policies, and so its Ref.Policy in the
// state's group.
type policy struct {
	name  string
	index int
	pc    config.PolicyConfig
	ep    engine.Policy // the limit and window it decides
	// limits are the keys with a limit of their own (pc.Overrides), as
	// the backend applies them; nil for none.
	limits  map[string]int
	backend engine.Backend
	// admin is backend as an engine.KeyAdmin, nil when it cannot show
	// and reset keys (/admin/keys answers 501).
	admin engine.KeyAdmin
	hw    *httpkit.HeaderWriter
	m     policyMetrics
	// borrowsKey: backend keeps nothing of the key strings it decides
	// (httpkit.BorrowsKey), so the decision API may hand it a view of
	// the request's buffer.
	borrowsKey bool
}

// state is what a configuration reload replaces as a whole: the policies
// and everything built from them. Requests take mu for reading while they
// use a state, so that a reload can wait for them before closing the
// backends it retired.
type state struct {
	mu       sync.RWMutex
	cfg      config.Config
	policies []*policy
	byName   map[string]*policy
	def      *policy
	// group decides over any subset of policies (Ref.Policy is a policy's
	// index), all or nothing; nil when the store cannot.
	group engine.GroupBackend
	// closeStore, for a store other than memory, closes the Store the
	// policies' backends come from; memory policies are closed one by one, as
	// a reload keeps the unchanged ones.
	closeStore func() error
	routes     *router
	admin      *adminGuard // the admin listener's Host allow-list and token
	handler    http.Handler
}

// build makes a state for cfg (defaults filled in). With the memory
// store it reuses the policies of old whose settings are unchanged, so that they
// keep their state, and makes one group over all of them; another store
// is asked for every policy again (its state lives in the store). On
// error nothing it made is left open.
func (s *Server) build(cfg config.Config, old *state) (*state, error) {
	memory := cfg.Store == config.DefaultStore
	st := &state{cfg: cfg, byName: map[string]*policy{}}
	var fresh []config.PolicyConfig
	var retune []retuned
	var resets []string
	for _, pc := range cfg.Policies {
		if memory && old != nil {
			if t, ok := old.byName[pc.Name]; ok {
				if t.pc.SameBut(pc) {
					continue // its overrides are set below
				}
				r, why := retunable(t, pc)
				if why == "" {
					retune = append(retune, r)
					continue
				}
				resets = append(resets, pc.Name+": "+why)
			}
		}
		fresh = append(fresh, pc)
	}
	store, err := s.makeStore(cfg, fresh)
	if err != nil {
		return nil, err
	}
	// A policy whose limit or window changed keeps its limiter, and so
	// every key's log: the limiter takes the new policy in place, before
	// the tiers' header writers and the group read it, and gets the old
	// one back if the build fails.
	retuned := map[string]engine.Policy{}
	for _, r := range retune {
		if err := r.lim.SetPolicy(r.to); err != nil {
			return nil, fmt.Errorf("server: policy %q: %w", r.to.Name, err) // retunable has checked
		}
		retuned[r.to.Name] = r.to
	}
	ok := false
	// Overrides changed on a limiter kept from old, to restore if the
	// build fails.
	type overridden struct {
		lim  *engine.Limiter
		from map[string]int
	}
	var reset []overridden
	defer func() {
		if !ok {
			for _, r := range retune {
				_ = r.lim.SetPolicy(r.from) // the policy it had: always possible
			}
			for _, o := range reset {
				_ = o.lim.SetOverrides(o.from) // the ones it had: always possible
			}
			if err := store.Close(); err != nil {
				s.log.Warn("closing store", "err", err)
			}
		}
	}()
	// The policies' header writers serve the decision API; the gateway's
	// middleware writes cfg.Headers (middlewareOptions).
	which := cfg.DecisionHeaders.Which()
	made := map[string]engine.Backend{}
	var changedOverrides []string
	for i, b := range store.Backends {
		if b.Policy().Name != fresh[i].Name {
			return nil, fmt.Errorf("server: store made a backend for policy %q where %q was asked", b.Policy().Name, fresh[i].Name)
		}
		made[fresh[i].Name] = b
	}
	for i, pc := range cfg.Policies {
		var t *policy
		if b, ok := made[pc.Name]; ok {
			hw, err := httpkit.NewHeaderWriter(b, which)
			if err != nil {
				return nil, fmt.Errorf("server: policy %q: %w", pc.Name, err)
			}
			t = &policy{name: pc.Name, pc: pc, ep: b.Policy(), backend: b, hw: hw}
			t.m = s.metrics.forPolicy(t.name)
		} else {
			o := old.byName[pc.Name]
			hw, err := httpkit.NewHeaderWriter(o.backend, which)
			if err != nil {
				return nil, fmt.Errorf("server: policy %q: %w", pc.Name, err)
			}
			t = &policy{name: o.name, pc: pc, ep: o.ep, backend: o.backend, hw: hw, m: o.m}
			if p, ok := retuned[pc.Name]; ok {
				t.ep = p
			}
		}
		// A kept limiter takes its overrides in place, keeping every
		// key's log, as a retuned one takes its policy; a new one takes
		// them before it serves. Validate refuses overrides on another
		// store.
		if lim, isLim := t.backend.(*engine.Limiter); isLim && (len(pc.Overrides) > 0 || len(lim.Overrides()) > 0) {
			from, to := lim.Overrides(), pc.OverrideLimits()
			if !maps.Equal(from, to) {
				if err := lim.SetOverrides(to); err != nil {
					return nil, fmt.Errorf("server: policy %q: %w", pc.Name, err) // Validate has checked
				}
				if _, isNew := made[pc.Name]; !isNew {
					reset = append(reset, overridden{lim, from})
					changedOverrides = append(changedOverrides, pc.Name)
				}
			}
			t.limits = to
		}
		t.index = i
		t.borrowsKey = httpkit.BorrowsKey(t.backend)
		t.admin, _ = t.backend.(engine.KeyAdmin)
		st.policies = append(st.policies, t)
		st.byName[t.name] = t
	}
	st.def = st.byName[string(cfg.DefaultPolicy)]
	if memory {
		ls := make([]*engine.Limiter, len(st.policies))
		for i, t := range st.policies {
			ls[i] = t.backend.(*engine.Limiter) // made by makeStore
		}
		g, err := engine.NewGroupOf(ls...)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		st.group = g
	} else {
		st.group, st.closeStore = store.Group, store.Close
		if err := checkGroup(st); err != nil {
			return nil, err
		}
	}
	if err := needGroup(cfg, st.group); err != nil {
		return nil, err
	}
	if st.admin, err = newAdminGuard(cfg); err != nil {
		return nil, err
	}
	if st.routes, err = s.newRouter(st); err != nil {
		return nil, err
	}
	if cfg.Upstream != "" {
		if st.handler, err = s.gatewayHandler(st); err != nil {
			return nil, err
		}
	} else {
		if st.handler, err = s.apiHandler(st); err != nil {
			return nil, err
		}
	}
	ok = true
	for _, r := range retune {
		s.log.Info("policy changed in place; its keys keep their state", "policy", r.to.Name,
			"limit", r.to.Limit, "window", r.to.Window.String(), "previous_limit", r.from.Limit, "previous_window", r.from.Window.String())
	}
	for _, name := range changedOverrides {
		s.log.Info("policy overrides changed in place; its keys keep their state", "policy", name, "overrides", len(st.byName[name].limits))
	}
	for _, why := range resets {
		s.log.Warn("policy changed; its keys start empty: " + why)
	}
	return st, nil
}

// retuned is a policy whose limiter takes a changed limit or window in
// place (engine.Limiter.SetPolicy).
type retuned struct {
	lim      *engine.Limiter
	from, to engine.Policy
}

// retunable reports whether t's limiter can take pc in place, keeping its
// keys' state, or else why not (the reason a reload logs): a change of
// algorithm, of max_keys or overflow, or one the engine cannot make in
// place (engine.Limiter.CheckPolicy).
func retunable(t *policy, pc config.PolicyConfig) (retuned, string) {
	lim, ok := t.backend.(*engine.Limiter)
	if !ok {
		return retuned{}, "its store keeps no state in the process"
	}
	p, err := pc.Policy()
	switch {
	case err != nil:
		return retuned{}, err.Error()
	case p.Algorithm != t.ep.Algorithm:
		return retuned{}, fmt.Sprintf("the algorithm changed from %v to %v", t.ep.Algorithm, p.Algorithm)
	case pc.WithKeyCap().MaxKeys != t.pc.WithKeyCap().MaxKeys || pc.WithKeyCap().Overflow != t.pc.WithKeyCap().Overflow:
		return retuned{}, "max_keys or overflow changed"
	}
	if err := lim.CheckPolicy(p); err != nil {
		return retuned{}, err.Error()
	}
	return retuned{lim: lim, from: lim.Policy(), to: p}, ""
}

// checkGroup checks that a store's group decides over st's policies, in
// order.
func checkGroup(st *state) error {
	if st.group == nil {
		return nil
	}
	ps := st.group.Policies()
	if len(ps) != len(st.policies) {
		return fmt.Errorf("server: store made a group of %d policies for %d", len(ps), len(st.policies))
	}
	for i, p := range ps {
		if p.Name != st.policies[i].name {
			return fmt.Errorf("server: store made a group whose policy %d is %q where %q was asked", i, p.Name, st.policies[i].name)
		}
	}
	return nil
}

// needGroup reports, as a configuration error, a route of several limits
// on a store that cannot decide them at once.
func needGroup(cfg config.Config, g engine.GroupBackend) error {
	needsTag := g != nil && g.NeedsTag()
	for i, rc := range cfg.Routes {
		for _, l := range rc.Lists() {
			if len(l.Limits) < 2 {
				continue
			}
			if g == nil {
				return config.Errorf(fmt.Sprintf("routes[%d]%s", i, l.Field), "%d limits, but store %s cannot decide several limits at once (all or nothing); give the route one limit, or use a store that can", len(l.Limits), config.StoreScheme(cfg.Store))
			}
			if !needsTag || rc.ClusterTag != "" {
				continue
			}
			specs := map[string]bool{}
			for _, lc := range l.Limits {
				spec := lc.Key
				if spec == "" {
					spec = cfg.Key
				}
				specs[strings.TrimSpace(spec)] = true
			}
			if len(specs) > 1 {
				return config.Errorf(fmt.Sprintf("routes[%d].cluster_tag", i), "required: store %s keeps keys in hash slots (Redis Cluster), and the limits of routes[%d]%s use different keys, which one atomic call cannot reach; name the key that places them together (for example header:X-API-Key)", config.StoreScheme(cfg.Store), i, l.Field)
			}
		}
	}
	return nil
}
