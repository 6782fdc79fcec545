package rls

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/engine"
)

// ErrConfig is wrapped by every configuration error. The message names the
// file and line at fault.
var ErrConfig = errors.New("rls: config")

// Bounds on what a configuration may declare. MaxEntries also bounds the
// entries of a request's descriptor, so a rule nested deeper could never
// match and is refused.
const (
	// MaxConfigBytes bounds one configuration file.
	MaxConfigBytes = 16 << 20
	// MaxRules bounds the descriptors (with or without a rate limit) of the
	// whole configuration.
	MaxRules = 100_000
)

// units are the rate-limit units envoyproxy/ratelimit accepts, with the
// window each one means. MONTH and YEAR are fixed lengths there too (30
// and 365 days), not calendar periods.
var units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// Rule is one descriptor of the configuration that carries a rate_limit.
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path is the rule's place in the domain's tree, the entries that lead
	// to it joined by dots, each "key" or "key_value" (envoyproxy/ratelimit
	// names its statistics the same way). It labels metrics: it holds
	// configured values only, never a client's.
	Path string
	// Name is rate_limit.name (used by replaces); may be empty.
	Name string
	// Replaces lists the names of rules this one overrides when both match
	// one request.
	Replaces []string
	// Limit is requests_per_unit; 0 refuses every request.
	Limit int
	// Unit is the unit as written ("second", ...), lower case.
	Unit string
	// UnitMultiplier is the number of units in the window (default 1).
	UnitMultiplier int
	// Window is the sliding window: Unit × UnitMultiplier, or the window
	// key when set.
	Window time.Duration
	// Algorithm is the engine's algorithm (the log unless the algorithm
	// key says otherwise).
	Algorithm engine.Algorithm
	// Unlimited rules match and stop the lookup, but limit nothing.
	Unlimited bool
	// Shadow rules are decided and counted but never refuse.
	Shadow bool
	// File and Line locate the descriptor in the configuration.
	File string
	Line int
	// Policy is the rule's index among Config.Policies, or -1 for rules
	// that need none (unlimited, or a limit of 0).
	Policy int
}

// Config is a parsed configuration in envoyproxy/ratelimit's format: one
// or more domains, each a tree of descriptors. It is immutable once built
// and safe for concurrent use.
type Config struct {
	domains  map[string]*node
	rules    []*Rule
	policies []engine.Policy
	files    []string
}

// node is one level of a domain's descriptor tree.
type node struct {
	rule     *Rule // nil: the descriptor only leads to nested ones
	exact    map[entry]*node
	wildcard []wildcard // in file order; the first whose prefix matches wins
	byKey    map[string]*node
	path     string
}

type entry struct{ key, value string }

type wildcard struct {
	key, prefix string
	n           *node
}

func newNode(path string) *node {
	return &node{exact: map[entry]*node{}, byKey: map[string]*node{}, path: path}
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// Rules returns the configuration's rules in file order.
func (c *Config) Rules() []Rule {
	out := make([]Rule, len(c.rules))
	for i, r := range c.rules {
		out[i] = *r
	}
	return out
}

// Policies returns one engine policy per rule that limits (every rule but
// unlimited ones and those with a limit of 0), in file order: the policies
// of the group the service decides with (Rule.Policy indexes them).
func (c *Config) Policies() []engine.Policy { return slices.Clone(c.policies) }

// NewGroup returns an in-memory group over c's policies.
func (c *Config) NewGroup(opts ...engine.Option) (*engine.Group, error) {
	if len(c.policies) == 0 {
		return nil, fmt.Errorf("%w: no rule limits anything (every rate_limit is unlimited or 0)", ErrConfig)
	}
	g, err := engine.NewGroup(c.policies, opts...)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	return g, nil
}

// LoadConfig reads a configuration file, or every *.yaml and *.yml file of
// a directory (in name order, as envoyproxy/ratelimit reads its runtime
// directory). Each file holds one domain; a domain may not appear twice.
func LoadConfig(path string) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var files []string
	if st.IsDir() {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%w: %s: no .yaml or .yml files", ErrConfig, path)
		}
	} else {
		files = []string{path}
	}
	c := newConfig()
	for _, f := range files {
		data, err := readBounded(f)
		if err != nil {
			return nil, err
		}
		if err := c.add(f, data); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func readBounded(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if len(data) > MaxConfigBytes {
		return nil, fmt.Errorf("%w: %s: larger than %d bytes", ErrConfig, name, MaxConfigBytes)
	}
	return data, nil
}

// ParseConfig parses one or more YAML documents, each one domain; name is
// used in error messages.
func ParseConfig(name string, data []byte) (*Config, error) {
	c := newConfig()
	if err := c.add(name, data); err != nil {
		return nil, err
	}
	return c, nil
}

func newConfig() *Config { return &Config{domains: map[string]*node{}} }

// parser holds the file being read, for error messages.
type parser struct {
	c    *Config
	file string
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%w: %s:%d: %s", ErrConfig, p.file, n.Line, fmt.Sprintf(format, args...))
}

func (c *Config) add(name string, data []byte) error {
	p := &parser{c: c, file: name}
	c.files = append(c.files, name)
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	docs := 0
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrConfig, name, err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		if err := p.domain(doc.Content[0]); err != nil {
			return err
		}
		docs++
	}
	if docs == 0 {
		return fmt.Errorf("%w: %s: no domain (the file is empty)", ErrConfig, name)
	}
	return nil
}

// fields checks that n is a mapping whose keys are all in allowed, and
// returns key → value node.
func (p *parser) fields(n *yaml.Node, what string, allowed ...string) (map[string]*yaml.Node, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(n, "%s must be a mapping", what)
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, p.errorf(k, "%s: keys must be strings", what)
		}
		if !slices.Contains(allowed, k.Value) {
			return nil, p.errorf(k, "%s: unknown key %q (want one of %s)", what, k.Value, strings.Join(allowed, ", "))
		}
		if _, dup := out[k.Value]; dup {
			return nil, p.errorf(k, "%s: key %q given twice", what, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

func (p *parser) str(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.errorf(n, "%s must be a string", what)
	}
	return n.Value, nil
}

func (p *parser) boolean(n *yaml.Node, what string) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, p.errorf(n, "%s must be true or false, not %q", what, n.Value)
	}
	return b, nil
}

func (p *parser) integer(n *yaml.Node, what string, lo, hi int64) (int64, error) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Decode(&v) != nil {
		return 0, p.errorf(n, "%s must be an integer, not %q", what, n.Value)
	}
	if v < lo || v > hi {
		return 0, p.errorf(n, "%s %d is outside %d..%d", what, v, lo, hi)
	}
	return v, nil
}

func (p *parser) domain(n *yaml.Node) error {
	f, err := p.fields(n, "the file", "domain", "descriptors")
	if err != nil {
		return err
	}
	dn, ok := f["domain"]
	if !ok {
		return p.errorf(n, "domain is missing")
	}
	domain, err := p.str(dn, "domain")
	if err != nil {
		return err
	}
	if err := checkName(domain, MaxDomainLen); err != nil {
		return p.errorf(dn, "domain: %v", err)
	}
	if _, dup := p.c.domains[domain]; dup {
		return p.errorf(dn, "domain %q is configured twice", domain)
	}
	root := newNode("")
	p.c.domains[domain] = root
	if ds, ok := f["descriptors"]; ok {
		return p.descriptors(ds, domain, root, 1)
	}
	return nil
}

func (p *parser) descriptors(n *yaml.Node, domain string, parent *node, depth int) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, "descriptors must be a list")
	}
	if depth > MaxEntries && len(n.Content) > 0 {
		return p.errorf(n, "descriptors nested deeper than %d levels can never match (a request's descriptor has at most %d entries)", MaxEntries, MaxEntries)
	}
	for _, d := range n.Content {
		if err := p.descriptor(d, domain, parent, depth); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(n *yaml.Node, domain string, parent *node, depth int) error {
	if len(p.c.rules) >= MaxRules {
		return p.errorf(n, "more than %d descriptors", MaxRules)
	}
	f, err := p.fields(n, "a descriptor", "key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric")
	if err != nil {
		return err
	}
	kn, ok := f["key"]
	if !ok {
		return p.errorf(n, "descriptor has no key")
	}
	key, err := p.str(kn, "key")
	if err != nil {
		return err
	}
	if err := checkName(key, MaxKeyLen); err != nil {
		return p.errorf(kn, "key: %v", err)
	}
	value := ""
	if vn, ok := f["value"]; ok {
		if value, err = p.str(vn, "value"); err != nil {
			return err
		}
		if len(value) > MaxValueLen {
			return p.errorf(vn, "value is longer than %d bytes", MaxValueLen)
		}
	}
	seg := key
	if value != "" {
		seg += "_" + value
	}
	path := seg
	if parent.path != "" {
		path = parent.path + "." + seg
	}
	child := newNode(path)
	switch {
	case value == "":
		if _, dup := parent.byKey[key]; dup {
			return p.errorf(kn, "duplicate descriptor %q", path)
		}
		parent.byKey[key] = child
	case strings.HasSuffix(value, "*"):
		prefix := strings.TrimSuffix(value, "*")
		for _, w := range parent.wildcard {
			if w.key == key && w.prefix == prefix {
				return p.errorf(kn, "duplicate descriptor %q", path)
			}
		}
		parent.wildcard = append(parent.wildcard, wildcard{key: key, prefix: prefix, n: child})
	default:
		e := entry{key, value}
		if _, dup := parent.exact[e]; dup {
			return p.errorf(kn, "duplicate descriptor %q", path)
		}
		parent.exact[e] = child
	}
	shadow := false
	if sn, ok := f["shadow_mode"]; ok {
		if shadow, err = p.boolean(sn, "shadow_mode"); err != nil {
			return err
		}
	}
	if dn, ok := f["detailed_metric"]; ok {
		// Accepted for compatibility, and ignored: it would label metrics
		// with request values, which are client identities.
		if _, err := p.boolean(dn, "detailed_metric"); err != nil {
			return err
		}
	}
	if rn, ok := f["rate_limit"]; ok {
		r, err := p.rateLimit(rn, keyNode(n, "rate_limit"), domain, path, shadow)
		if err != nil {
			return err
		}
		child.rule = r
	} else if shadow {
		return p.errorf(f["shadow_mode"], "shadow_mode needs a rate_limit on the same descriptor")
	}
	if dn, ok := f["descriptors"]; ok {
		return p.descriptors(dn, domain, child, depth+1)
	}
	return nil
}

// rateLimit parses the rate_limit value n, whose key is at; errors about
// missing fields name at's line.
func (p *parser) rateLimit(n, at *yaml.Node, domain, path string, shadow bool) (*Rule, error) {
	f, err := p.fields(n, "rate_limit", "unit", "requests_per_unit", "unlimited", "name", "replaces",
		"unit_multiplier", "window", "algorithm")
	if err != nil {
		return nil, err
	}
	r := &Rule{Domain: domain, Path: path, Shadow: shadow, File: p.file, Line: at.Line, Policy: -1, UnitMultiplier: 1}
	if v, ok := f["unlimited"]; ok {
		if r.Unlimited, err = p.boolean(v, "unlimited"); err != nil {
			return nil, err
		}
	}
	if v, ok := f["name"]; ok {
		if r.Name, err = p.str(v, "name"); err != nil {
			return nil, err
		}
		if err := checkName(r.Name, MaxKeyLen); err != nil {
			return nil, p.errorf(v, "name: %v", err)
		}
	}
	if v, ok := f["replaces"]; ok {
		if v.Kind != yaml.SequenceNode {
			return nil, p.errorf(v, "replaces must be a list of {name: ...}")
		}
		for _, e := range v.Content {
			ef, err := p.fields(e, "a replaces entry", "name")
			if err != nil {
				return nil, err
			}
			nn, ok := ef["name"]
			if !ok {
				return nil, p.errorf(e, "a replaces entry needs a name")
			}
			name, err := p.str(nn, "name")
			if err != nil {
				return nil, err
			}
			if name == "" {
				return nil, p.errorf(nn, "a replaces entry has an empty name")
			}
			if name == r.Name {
				return nil, p.errorf(nn, "a rate limit cannot replace itself (%q)", name)
			}
			r.Replaces = append(r.Replaces, name)
		}
	}
	if r.Unlimited {
		for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier", "window", "algorithm"} {
			if v, ok := f[k]; ok {
				return nil, p.errorf(v, "an unlimited rate_limit takes no %s", k)
			}
		}
		p.c.rules = append(p.c.rules, r)
		return r, nil
	}
	un, ok := f["unit"]
	if !ok {
		return nil, p.errorf(at, "rate_limit needs a unit (second, minute, hour, day, week, month or year) or unlimited: true")
	}
	unit, err := p.str(un, "unit")
	if err != nil {
		return nil, err
	}
	r.Unit = strings.ToLower(unit)
	base, ok := units[r.Unit]
	if !ok {
		return nil, p.errorf(un, "unknown unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	rn, ok := f["requests_per_unit"]
	if !ok {
		return nil, p.errorf(at, "rate_limit needs requests_per_unit")
	}
	algo := engine.SlidingLog
	if v, ok := f["algorithm"]; ok {
		s, err := p.str(v, "algorithm")
		if err != nil {
			return nil, err
		}
		if algo, err = engine.ParseAlgorithm(s); err != nil {
			return nil, p.errorf(v, "%v", err)
		}
	}
	r.Algorithm = algo
	maxLimit := int64(engine.MaxCounterLimit)
	if algo == engine.SlidingLog {
		maxLimit = engine.MaxLogLimit
	}
	lim, err := p.integer(rn, "requests_per_unit", 0, maxLimit)
	if err != nil {
		if algo == engine.SlidingLog {
			return nil, fmt.Errorf("%w (the exact log keeps one entry per request; algorithm: counter allows up to %d)", err, engine.MaxCounterLimit)
		}
		return nil, err
	}
	r.Limit = int(lim)
	r.Window = base
	if v, ok := f["unit_multiplier"]; ok {
		m, err := p.integer(v, "unit_multiplier", 1, int64(engine.MaxWindow/base))
		if err != nil {
			return nil, err
		}
		r.UnitMultiplier = int(m)
		r.Window = base * time.Duration(m)
	}
	if v, ok := f["window"]; ok {
		if _, both := f["unit_multiplier"]; both {
			return nil, p.errorf(v, "give window or unit_multiplier, not both")
		}
		s, err := p.str(v, "window")
		if err != nil {
			return nil, err
		}
		w, err := time.ParseDuration(s)
		if err != nil || w <= 0 || w > engine.MaxWindow {
			return nil, p.errorf(v, "window %q must be a duration between 1ns and %v (like 90s)", s, engine.MaxWindow)
		}
		r.Window = w
	}
	if r.Limit > 0 {
		r.Policy = len(p.c.policies)
		name := r.Name
		if name == "" {
			name = domain + "." + path
		}
		p.c.policies = append(p.c.policies, engine.Policy{Name: name, Limit: r.Limit, Window: r.Window, Algorithm: algo})
	}
	p.c.rules = append(p.c.rules, r)
	return r, nil
}

// keyNode returns the key node of name in mapping n (n itself if absent).
func keyNode(n *yaml.Node, name string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == name {
			return n.Content[i]
		}
	}
	return n
}

// checkName checks a domain, key or name: 1 to max bytes of UTF-8.
func checkName(s string, max int) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > max:
		return fmt.Errorf("longer than %d bytes", max)
	}
	return nil
}

// match returns the rule a descriptor's entries select in domain root, or
// nil: each entry descends one level, preferring a descriptor with the
// entry's value, then one whose value ends in * and prefixes it, then one
// with the key alone; the rule is the one of the level the last entry
// reaches. A request with more entries than the matching branch is deep
// matches nothing, as in envoyproxy/ratelimit.
func match(root *node, entries []entry) *Rule {
	n := root
	for _, e := range entries {
		next := n.exact[e]
		if next == nil {
			for _, w := range n.wildcard {
				if w.key == e.key && strings.HasPrefix(e.value, w.prefix) {
					next = w.n
					break
				}
			}
		}
		if next == nil {
			next = n.byKey[e.key]
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n.rule
}
