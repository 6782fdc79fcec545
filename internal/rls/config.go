package rls

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/engine"
	"github.com/slidegate/slidegate/internal/server/config"
)

// ErrConfig is wrapped by every configuration error. The message names the
// file and line at fault.
var ErrConfig = errors.New("rls: config")

// Bounds on what a configuration may declare.
const (
	// MaxConfigBytes bounds one configuration file.
	MaxConfigBytes = 16 << 20
	// MaxConfigTotalBytes bounds all the files of a configuration
	// together.
	MaxConfigTotalBytes = 64 << 20
	// MaxConfigNodes bounds the YAML nodes one file stands for with its
	// aliases expanded: aliases of aliases can stand for far more nodes
	// than a file holds (billion laughs).
	MaxConfigNodes = 2_000_000
	// MaxRules bounds the descriptors (with or without a rate limit) of the
	// whole configuration.
	MaxRules = 100_000
	// MaxLimitedRules bounds the descriptors with a rate limit (each one a
	// limiter on the memory store, about 30 KB before any traffic).
	MaxLimitedRules = 20_000
	// MaxRequestsPerUnit is the largest requests_per_unit, as
	// envoyproxy/ratelimit reads it (a uint32).
	MaxRequestsPerUnit = math.MaxUint32
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

// validKeys are the keys envoyproxy/ratelimit allows anywhere in a file
// (it checks the names, not where they stand), and slidegate's own
// rate_limit keys.
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true,
	// slidegate's additions, read under rate_limit only.
	"unit_multiplier": true, "window": true, "algorithm": true,
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
	// Limit is requests_per_unit (0 to MaxRequestsPerUnit, so int64 on
	// 32-bit platforms too); 0 refuses every request that costs anything.
	Limit int64
	// Unit is the unit as written ("second", ...), lower case.
	Unit string
	// UnitMultiplier is the number of units in the window (default 1).
	UnitMultiplier int
	// Window is the sliding window: Unit × UnitMultiplier, or the window
	// key when set.
	Window time.Duration
	// Algorithm is the engine's algorithm: the log unless the algorithm key
	// says otherwise or Limit is above engine.MaxLogLimit (then the
	// counter, with a warning).
	Algorithm engine.Algorithm
	// Unlimited rules match and stop the lookup, but limit nothing.
	Unlimited bool
	// Shadow rules are decided and counted but never refuse.
	Shadow bool
	// Quota rules (quota_mode) are decided like shadow rules; a request
	// over one is reported OK and named in the response's dynamic
	// metadata.
	Quota bool
	// ShareThreshold (on a wildcard value): every value the wildcard
	// matches counts against one shared key.
	ShareThreshold bool
	// File and Line locate the descriptor in the configuration.
	File string
	Line int
	// Policy is the rule's index among Config.Policies, or -1 for rules
	// that need none (unlimited, or a limit of 0).
	Policy int

	ov       *engine.Policy // a request's limit override: its policy (Policy indexes it past the configuration's)
	aboveLog bool           // requests_per_unit above the exact log's cap: on the counter
}

// enforced reports whether the rule can refuse a request.
func (r *Rule) enforced() bool { return !r.Shadow && !r.Quota }

// Config is a parsed configuration in envoyproxy/ratelimit's format: one
// or more domains, each a tree of descriptors. It is immutable once built
// and safe for concurrent use.
type Config struct {
	domains  map[string]*node
	rules    []*Rule
	policies []engine.Policy
	files    []string
	warnings []string
	merge    bool
}

// node is one level of a domain's descriptor tree, laid out as
// envoyproxy/ratelimit's: children by "key" or "key_value", and the
// children whose "key_value" ends in * in file order.
type node struct {
	rule     *Rule // nil: the descriptor only leads to nested ones
	children map[string]*node
	wildcard []string // the children's keys that end in *
	share    bool     // share_threshold on this wildcard descriptor
	pattern  string   // its "key_value*", when share is set
	path     string
}

type entry struct{ key, value string }

func newNode(path string) *node { return &node{children: map[string]*node{}, path: path} }

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

// Files returns the files the configuration was read from, in order.
func (c *Config) Files() []string { return slices.Clone(c.files) }

// Warnings returns what the configuration does that its author may not
// expect (a limit the exact log cannot hold, a key that has no meaning
// where it stands), one sentence each naming file and line.
func (c *Config) Warnings() []string { return slices.Clone(c.warnings) }

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

// LoadOptions say how LoadDir reads a directory.
type LoadOptions struct {
	// AllFiles reads every file under the directory, recursively, as
	// envoyproxy/ratelimit reads its runtime directory; otherwise only the
	// directory's own *.yaml and *.yml files.
	AllFiles bool
	// IgnoreDotFiles skips files and directories whose name starts with a
	// dot (envoyproxy/ratelimit's RUNTIME_IGNOREDOTFILES).
	IgnoreDotFiles bool
	// Merge lets several files configure one domain, their descriptors
	// merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); otherwise a
	// domain configured twice is an error.
	Merge bool
}

// LoadConfig reads a configuration file, or every *.yaml and *.yml file of
// a directory (in name order). Each file holds one domain; a domain may
// not appear twice.
func LoadConfig(path string) (*Config, error) { return LoadDir(path, LoadOptions{}) }

// LoadDir reads a configuration file, or the files of a directory as opts
// say, in name order. Only regular files are read (a symlink to one
// counts; a symlink to a directory is not followed); a device, FIFO or
// socket is an error, as is a file over MaxConfigBytes or files over
// MaxConfigTotalBytes together. With opts.AllFiles, a directory with no
// files is a configuration with no domains, as envoyproxy/ratelimit
// starts with one.
func LoadDir(path string, opts LoadOptions) (*Config, error) {
	st, err := statFiles(path, opts)
	if err != nil {
		return nil, err
	}
	data, err := readFiles(st)
	if err != nil {
		return nil, err
	}
	return parseFiles(path, st, data, opts.Merge)
}

// parseFiles parses the files read, in order.
func parseFiles(path string, st []fileStat, data [][]byte, merge bool) (*Config, error) {
	c := newConfig()
	c.merge = merge
	if len(st) == 0 {
		c.warnings = append(c.warnings, fmt.Sprintf("%s: no configuration files: every request is answered OK (no limit) until some arrive", path))
	}
	for i, f := range st {
		if err := c.add(f.name, data[i]); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// fileStat is what LoadDir learns of a file before it reads it.
type fileStat struct {
	name  string
	size  int64
	mod   time.Time
	mode  fs.FileMode
	ino   uint64
	ctime int64
}

// statFiles lists the files LoadDir reads, with their sizes and times,
// refusing what is not a regular file and sizes over the bounds, without
// opening any.
func statFiles(path string, opts LoadOptions) ([]fileStat, error) {
	root, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var names []string
	if !root.IsDir() {
		names = []string{path}
	} else if opts.AllFiles {
		err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if opts.IgnoreDotFiles && p != path && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.IsDir() {
				names = append(names, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	} else {
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		for _, e := range ents {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
				names = append(names, filepath.Join(path, e.Name()))
			}
		}
	}
	slices.Sort(names)
	out := make([]fileStat, 0, len(names))
	var total int64
	for _, n := range names {
		fi, err := os.Stat(n) // through a symlink
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		switch {
		case fi.IsDir() && n != path:
			continue // a symlink to a directory: not followed
		case !fi.Mode().IsRegular():
			return nil, fmt.Errorf("%w: %s: not a regular file (%s): refused", ErrConfig, n, fileType(fi.Mode()))
		case fi.Size() > MaxConfigBytes:
			return nil, fmt.Errorf("%w: %s: larger than %d bytes", ErrConfig, n, MaxConfigBytes)
		}
		if total += fi.Size(); total > MaxConfigTotalBytes {
			return nil, fmt.Errorf("%w: %s: the files are larger than %d bytes together", ErrConfig, path, MaxConfigTotalBytes)
		}
		ino, ctime := fileIdentity(fi)
		out = append(out, fileStat{name: n, size: fi.Size(), mod: fi.ModTime(), mode: fi.Mode(), ino: ino, ctime: ctime})
	}
	if len(out) == 0 && !(root.IsDir() && opts.AllFiles) {
		return nil, fmt.Errorf("%w: %s: no configuration files", ErrConfig, path)
	}
	return out, nil
}

// fileType names what a file that is not regular is.
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return m.Type().String()
}

// readFiles reads the files statFiles listed, each within
// MaxConfigBytes and all within MaxConfigTotalBytes, whatever they have
// grown to since.
func readFiles(st []fileStat) ([][]byte, error) {
	out := make([][]byte, len(st))
	budget := int64(MaxConfigTotalBytes)
	for i, f := range st {
		b, err := readBounded(f.name, min(MaxConfigBytes, budget))
		if err != nil {
			return nil, err
		}
		budget -= int64(len(b))
		out[i] = b
	}
	return out, nil
}

// filesRead counts the files readBounded opened: the tests check that
// an idle watch opens none.
var filesRead atomic.Int64

// readBounded reads a regular file of at most limit bytes. It opens the
// file without blocking, so that a FIFO swapped in after statFiles looked
// cannot hang the reader, and checks what it opened.
func readBounded(name string, limit int64) ([]byte, error) {
	filesRead.Add(1)
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s: not a regular file (%s): refused", ErrConfig, name, fileType(fi.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if int64(len(data)) > limit {
		if limit < MaxConfigBytes {
			return nil, fmt.Errorf("%w: %s: the files are larger than %d bytes together", ErrConfig, name, MaxConfigTotalBytes)
		}
		return nil, fmt.Errorf("%w: %s: larger than %d bytes", ErrConfig, name, MaxConfigBytes)
	}
	return data, nil
}

// ParseConfig parses one file's contents; name is used in error messages.
func ParseConfig(name string, data []byte) (*Config, error) {
	c := newConfig()
	if err := c.add(name, data); err != nil {
		return nil, err
	}
	return c, nil
}

// ParseConfigs parses several files' contents (name → contents, read in
// name order), merging domains configured twice when merge is set.
func ParseConfigs(files map[string][]byte, merge bool) (*Config, error) {
	c := newConfig()
	c.merge = merge
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := c.add(n, files[n]); err != nil {
			return nil, err
		}
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

func (p *parser) warnf(n *yaml.Node, format string, args ...any) {
	p.c.warnings = append(p.c.warnings, fmt.Sprintf("%s:%d: %s", p.file, n.Line, fmt.Sprintf(format, args...)))
}

// add reads one file. As envoyproxy/ratelimit does, only its first YAML
// document is read.
func (c *Config) add(name string, data []byte) error {
	p := &parser{c: c, file: name}
	c.files = append(c.files, name)
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	err := dec.Decode(&doc)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %s: %w", ErrConfig, name, err)
	}
	if errors.Is(err, io.EOF) || len(doc.Content) == 0 {
		return fmt.Errorf("%w: %s: no domain (the file is empty)", ErrConfig, name)
	}
	if config.ExpandedNodes(&doc, MaxConfigNodes) > MaxConfigNodes {
		return fmt.Errorf("%w: %s: aliases expand the file past %d nodes (or an alias is inside its own anchor)", ErrConfig, name, MaxConfigNodes)
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil && len(next.Content) > 0 {
		p.warnf(&next, "a second YAML document: ignored (one file holds one domain, as in envoyproxy/ratelimit)")
	}
	root := doc.Content[0]
	if err := p.validate(root, "the file"); err != nil {
		return err
	}
	return p.domain(root)
}

// validate checks every key of the tree as envoyproxy/ratelimit does: each
// a string and a known name, lists holding mappings only, and leaves
// strings, integers, booleans or null.
func (p *parser) validate(n *yaml.Node, what string) error {
	n = config.Resolve(n)
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := config.Resolve(n.Content[i]), n.Content[i+1]
			if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
				return p.errorf(k, "%s: a key must be a string, not %q", what, k.Value)
			}
			if !validKeys[k.Value] {
				return p.errorf(k, "%s: unknown key %q", what, k.Value)
			}
			vv := config.Resolve(v)
			if vv.Kind == yaml.SequenceNode {
				for _, e := range vv.Content {
					if config.Resolve(e).Kind != yaml.MappingNode {
						return p.errorf(e, "%s: a list may hold mappings only", k.Value)
					}
				}
			}
			inner := k.Value
			switch k.Value {
			case "descriptors":
				inner = "a descriptor"
			case "replaces":
				inner = "a replaces entry"
			}
			if err := p.validate(v, inner); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, e := range n.Content {
			if err := p.validate(e, what); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str", "!!int", "!!bool", "!!null":
			if n.Tag == "!!int" {
				if _, err := strconv.ParseInt(n.Value, 0, 64); err != nil {
					return p.errorf(n, "%q is not a 64-bit integer", n.Value)
				}
			}
		default:
			return p.errorf(n, "%q is a %s; values are strings, integers or booleans", n.Value, strings.TrimPrefix(n.Tag, "!!"))
		}
	}
	return nil
}

// fields returns a mapping's key → value node, with the keys of want; the
// others, valid names in the wrong place, are ignored with a warning, as
// envoyproxy/ratelimit ignores them.
func (p *parser) fields(n *yaml.Node, what string, want ...string) (map[string]*yaml.Node, error) {
	n = config.Resolve(n)
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(n, "%s must be a mapping", what)
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := config.Resolve(n.Content[i]), config.Resolve(n.Content[i+1])
		if !slices.Contains(want, k.Value) {
			p.warnf(k, "%s: key %q has no meaning here; ignored", what, k.Value)
			continue
		}
		if _, dup := out[k.Value]; dup {
			return nil, p.errorf(k, "%s: key %q given twice", what, k.Value)
		}
		out[k.Value] = v
	}
	return out, nil
}

// The peer's scalars are read as the server's configuration reads its
// fields (internal/server/config): each by a type of its own that reads
// the field's node (yaml.Unmarshaler). The types say what the peer's
// YAML library accepts, which is not what the server accepts (yes and on
// are booleans here, as in YAML 1.1). A null field is its type's zero
// value; a field absent is nil.

// peerString is a string field: any scalar's text, as the peer's YAML
// library reads it.
type peerString string

func (s *peerString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New("must be a string")
	}
	*s = peerString(n.Value)
	return nil
}

// peerBool is a boolean field, in YAML 1.1's words.
type peerBool bool

func (b *peerBool) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		switch n.Value {
		case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE":
			*b = true
			return nil
		case "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE":
			*b = false
			return nil
		}
	}
	return fmt.Errorf("must be true or false, not %q", n.Value)
}

// peerInt is an integer field (a !!int of 64 bits); the field's reader
// checks its range.
type peerInt int64

// errIntRange refuses an integer that does not fit 64 bits.
var errIntRange = errors.New("out of range")

func (i *peerInt) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return fmt.Errorf("must be an integer, not %q", n.Value)
	}
	v, err := strconv.ParseInt(n.Value, 0, 64)
	if err != nil {
		return errIntRange
	}
	*i = peerInt(v)
	return nil
}

// read reads field n (nil when absent) into v, a field type of the
// peer's, as yaml.v3's decoder does: null leaves v at its zero value,
// and any other node goes to v's UnmarshalYAML. It calls that directly:
// the walker has resolved n's alias, and a decoder per field would cost
// four allocations.
func read(n *yaml.Node, v yaml.Unmarshaler) error {
	if n == nil || n.Tag == "!!null" {
		return nil
	}
	return v.UnmarshalYAML(n)
}

// str reads a string field; null is "".
func (p *parser) str(n *yaml.Node, what string) (string, error) {
	var s peerString
	if err := read(n, &s); err != nil {
		return "", p.errorf(n, "%s %v", what, err)
	}
	return string(s), nil
}

// boolean reads a boolean field; null is false.
func (p *parser) boolean(n *yaml.Node, what string) (bool, error) {
	var b peerBool
	if err := read(n, &b); err != nil {
		return false, p.errorf(n, "%s %v", what, err)
	}
	return bool(b), nil
}

// integer reads an integer field within lo..hi; null is 0, whatever the
// range.
func (p *parser) integer(n *yaml.Node, what string, lo, hi int64) (int64, error) {
	if n == nil || n.Tag == "!!null" {
		return 0, nil
	}
	var i peerInt
	err := read(n, &i)
	if errors.Is(err, errIntRange) || (err == nil && (int64(i) < lo || int64(i) > hi)) {
		return 0, p.errorf(n, "%s %s is outside %d..%d", what, n.Value, lo, hi)
	} else if err != nil {
		return 0, p.errorf(n, "%s %v", what, err)
	}
	return int64(i), nil
}

func (p *parser) domain(n *yaml.Node) error {
	f, err := p.fields(n, "the file", "domain", "descriptors")
	if err != nil {
		return err
	}
	domain, err := p.str(f["domain"], "domain")
	if err != nil {
		return err
	}
	if dn, ok := f["domain"]; !ok {
		return p.errorf(n, "domain is missing")
	} else if domain == "" {
		return p.errorf(dn, "domain: empty")
	}
	root, dup := p.c.domains[domain]
	if dup && !p.c.merge {
		return p.errorf(f["domain"], "domain %q is configured twice (set MERGE_DOMAIN_CONFIG to merge)", domain)
	}
	if !dup {
		root = newNode("")
		p.c.domains[domain] = root
	}
	if ds, ok := f["descriptors"]; ok {
		return p.descriptors(ds, domain, root)
	}
	return nil
}

func (p *parser) descriptors(n *yaml.Node, domain string, parent *node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, "descriptors must be a list")
	}
	for _, d := range n.Content {
		if err := p.descriptor(d, domain, parent); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(n *yaml.Node, domain string, parent *node) error {
	if len(p.c.rules) >= MaxRules {
		return p.errorf(n, "more than %d descriptors", MaxRules)
	}
	f, err := p.fields(n, "a descriptor", "key", "value", "rate_limit", "descriptors", "shadow_mode",
		"quota_mode", "detailed_metric", "value_to_metric", "share_threshold")
	if err != nil {
		return err
	}
	n = config.Resolve(n)
	key, err := p.str(f["key"], "key")
	if err != nil {
		return err
	}
	if key == "" {
		return p.errorf(n, "descriptor has no key (or an empty one)")
	}
	value, err := p.str(f["value"], "value")
	if err != nil {
		return err
	}
	flags := map[string]bool{}
	for _, k := range []string{"shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"} {
		if flags[k], err = p.boolean(f[k], k); err != nil {
			return err
		}
	}
	seg := key
	if value != "" {
		seg += "_" + value
	}
	if _, dup := parent.children[seg]; dup {
		return p.errorf(keyNode(n, "key"), "duplicate descriptor %q", joinPath(parent.path, seg))
	}
	child := newNode(joinPath(parent.path, seg))
	wild := strings.HasSuffix(seg, "*")
	if flags["share_threshold"] {
		if !wild {
			return p.errorf(keyNode(n, "share_threshold"), "share_threshold can only be used with wildcard values (ending with '*'), not %q", seg)
		}
		child.share, child.pattern = true, seg
	}
	if wild {
		parent.wildcard = append(parent.wildcard, seg)
	}
	parent.children[seg] = child
	if rn, ok := f["rate_limit"]; ok && rn.Tag != "!!null" {
		r, err := p.rateLimit(rn, keyNode(n, "rate_limit"), domain, child.path)
		if err != nil {
			return err
		}
		r.Shadow, r.Quota, r.ShareThreshold = flags["shadow_mode"], flags["quota_mode"], flags["share_threshold"]
		child.rule = r
	}
	if dn, ok := f["descriptors"]; ok {
		return p.descriptors(dn, domain, child)
	}
	return nil
}

func joinPath(parent, seg string) string {
	if parent == "" {
		return seg
	}
	return parent + "." + seg
}

// rateLimit parses the rate_limit value n, whose key is at; errors about
// missing fields name at's line.
func (p *parser) rateLimit(n, at *yaml.Node, domain, path string) (*Rule, error) {
	f, err := p.fields(n, "rate_limit", "unit", "requests_per_unit", "unlimited", "name", "replaces",
		"unit_multiplier", "window", "algorithm")
	if err != nil {
		return nil, err
	}
	r := &Rule{Domain: domain, Path: path, File: p.file, Line: at.Line, Policy: -1, UnitMultiplier: 1}
	if r.Unlimited, err = p.boolean(f["unlimited"], "unlimited"); err != nil {
		return nil, err
	}
	if r.Name, err = p.str(f["name"], "name"); err != nil {
		return nil, err
	}
	if v, ok := f["replaces"]; ok && v.Tag != "!!null" {
		if v.Kind != yaml.SequenceNode {
			return nil, p.errorf(v, "replaces must be a list of {name: ...}")
		}
		for _, e := range v.Content {
			ef, err := p.fields(e, "a replaces entry", "name")
			if err != nil {
				return nil, err
			}
			name, err := p.str(ef["name"], "name")
			if err != nil {
				return nil, err
			}
			if name == "" {
				return nil, p.errorf(e, "a replaces entry has no name (or an empty one)")
			}
			if name == r.Name {
				return nil, p.errorf(e, "a rate limit cannot replace itself (%q)", name)
			}
			r.Replaces = append(r.Replaces, name)
		}
	}
	unit, err := p.str(f["unit"], "unit")
	if err != nil {
		return nil, err
	}
	r.Unit = strings.ToLower(unit)
	base, validUnit := units[r.Unit]
	if r.Unlimited {
		if validUnit {
			return nil, p.errorf(f["unit"], "an unlimited rate_limit takes no unit")
		}
		for _, k := range []string{"unit_multiplier", "window", "algorithm"} {
			if v, ok := f[k]; ok {
				return nil, p.errorf(v, "an unlimited rate_limit takes no %s", k)
			}
		}
		r.Unit = ""
		p.c.rules = append(p.c.rules, r)
		return r, nil
	}
	if un, ok := f["unit"]; !ok || un.Tag == "!!null" {
		return nil, p.errorf(at, "rate_limit needs a unit (second, minute, hour, day, week, month or year) or unlimited: true")
	} else if !validUnit {
		return nil, p.errorf(un, "unknown unit %q (want second, minute, hour, day, week, month or year)", unit)
	}
	lim, err := p.integer(f["requests_per_unit"], "requests_per_unit", 0, MaxRequestsPerUnit)
	if err != nil {
		return nil, err
	}
	r.Limit = lim
	algo := engine.SlidingLog
	explicit := false
	if v, ok := f["algorithm"]; ok {
		s, err := p.str(v, "algorithm")
		if err != nil {
			return nil, err
		}
		if algo, err = engine.ParseAlgorithm(s); err != nil {
			return nil, p.errorf(v, "%v", err)
		}
		explicit = true
	}
	if algo == engine.SlidingLog && r.Limit > engine.MaxLogLimit {
		if explicit {
			return nil, p.errorf(f["requests_per_unit"], "requests_per_unit %d is above the exact log's %d (the log keeps one entry per request; algorithm: counter allows more)", r.Limit, engine.MaxLogLimit)
		}
		algo = engine.SlidingCounter
		r.aboveLog = true
		p.warnf(f["requests_per_unit"], "%s.%s: requests_per_unit %d is above the exact log's %d (6 bytes per request in the window: %d MiB for one busy key); this rule uses the sliding window counter (about 100 bytes per key, approximate: docs/algorithms.md)",
			domain, path, r.Limit, engine.MaxLogLimit, r.Limit*6>>20)
	}
	if algo == engine.SlidingCounter && r.Limit > engine.MaxCounterLimit {
		p.warnf(f["requests_per_unit"], "%s.%s: requests_per_unit %d is above the counter's %d: the rule admits at most %d per window and reports the configured limit",
			domain, path, r.Limit, engine.MaxCounterLimit, engine.MaxCounterLimit)
	}
	r.Algorithm = algo
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
		if len(p.c.policies) >= MaxLimitedRules {
			return nil, p.errorf(n, "more than %d descriptors with a rate limit", MaxLimitedRules)
		}
		r.Policy = len(p.c.policies)
		name := r.Name
		if name == "" {
			name = domain + "." + path
		}
		p.c.policies = append(p.c.policies, engine.Policy{Name: name, Limit: int(min(r.Limit, int64(engine.MaxCounterLimit))), Window: r.Window, Algorithm: algo})
	}
	p.c.rules = append(p.c.rules, r)
	return r, nil
}

// keyNode returns the key node of name in mapping n (n itself if absent).
func keyNode(n *yaml.Node, name string) *yaml.Node {
	n = config.Resolve(n)
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == name {
			return n.Content[i]
		}
	}
	return n
}

// match returns the rule a descriptor's entries select in domain root, or
// nil, as envoyproxy/ratelimit looks it up: each entry descends one level,
// preferring the child "key_value", then the first child (in file order)
// whose "key_value" ends in * and prefixes the entry's "key_value", then
// the child "key"; the rule is the one of the level the last entry
// reaches. A request with more entries than the matching branch is deep
// matches nothing. share[i] is set, for an entry matched by a wildcard
// with share_threshold, to the wildcard's value (with its *), which then
// stands for the entry's value in the key; share is nil when none is.
func match(root *node, entries []entry) (r *Rule, share []string) {
	n := root
	var kvbuf [128]byte // "key_value", looked up without a string of its own
	for i, e := range entries {
		full := append(append(append(kvbuf[:0], e.key...), '_'), e.value...)
		next := n.children[string(full)]
		if next == nil {
			for _, w := range n.wildcard {
				if p := w[:len(w)-1]; len(full) >= len(p) && string(full[:len(p)]) == p {
					next = n.children[w]
					if next.share {
						if share == nil {
							share = make([]string, len(entries))
						}
						share[i] = strings.TrimPrefix(next.pattern, e.key+"_")
					}
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.key]
		}
		if next == nil {
			return nil, nil
		}
		if i == len(entries)-1 {
			return next.rule, share
		}
		if len(next.children) == 0 {
			return nil, nil
		}
		n = next
	}
	return nil, nil
}
