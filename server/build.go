package server

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/httpkit"
)

// policy is one policy in force: its backend, header writer and metrics. index is
// its place in the configuration's policies, and so its Ref.Policy in the
// state's group.
type policy struct {
	name    string
	index   int
	pc      PolicyConfig
	ep      engine.Policy // the limit and window it decides
	backend engine.Backend
	hw      *httpkit.HeaderWriter
	m       policyMetrics
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
	cfg      Config
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
func (s *Server) build(cfg Config, old *state) (*state, error) {
	memory := cfg.Store == DefaultStore
	st := &state{cfg: cfg, byName: map[string]*policy{}}
	var fresh []PolicyConfig
	for _, pc := range cfg.Policies {
		if memory && old != nil {
			if t, ok := old.byName[pc.Name]; ok && t.pc == pc {
				continue
			}
		}
		fresh = append(fresh, pc)
	}
	store, err := s.makeStore(cfg, fresh)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			if err := store.Close(); err != nil {
				s.log.Warn("closing store", "err", err)
			}
		}
	}()
	// The policies' header writers serve the decision API; the gateway's
	// middleware writes cfg.Headers (middlewareOptions).
	which := cfg.DecisionHeaders.Which()
	made := map[string]engine.Backend{}
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
			t = &policy{name: o.name, pc: o.pc, ep: o.ep, backend: o.backend, hw: hw, m: o.m}
		}
		t.index = i
		t.borrowsKey = httpkit.BorrowsKey(t.backend)
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
	return st, nil
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
func needGroup(cfg Config, g engine.GroupBackend) error {
	needsTag := g != nil && engine.NeedsTag(g)
	for i, rc := range cfg.Routes {
		for _, l := range rc.lists() {
			if len(l.limits) < 2 {
				continue
			}
			if g == nil {
				return fieldErr(fmt.Sprintf("routes[%d]%s", i, l.field), "%d limits, but store %s cannot decide several limits at once (all or nothing); give the route one limit, or use a store that can", len(l.limits), storeScheme(cfg.Store))
			}
			if !needsTag || rc.ClusterTag != "" {
				continue
			}
			specs := map[string]bool{}
			for _, lc := range l.limits {
				spec := lc.Key
				if spec == "" {
					spec = cfg.Key
				}
				specs[strings.TrimSpace(spec)] = true
			}
			if len(specs) > 1 {
				return fieldErr(fmt.Sprintf("routes[%d].cluster_tag", i), "required: store %s keeps keys in hash slots (Redis Cluster), and the limits of routes[%d]%s use different keys, which one atomic call cannot reach; name the key that places them together (for example header:X-API-Key)", storeScheme(cfg.Store), i, l.field)
			}
		}
	}
	return nil
}
