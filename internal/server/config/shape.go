package config

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Each struct of the configuration reads its own YAML mapping: it refuses
// a node that is not a mapping and a key it does not have, and names the
// key of a field that refuses its node, so that every error says by line,
// in the configuration's words, which node is wrong and what belongs there.

// A mapping is how a struct of the configuration is written in YAML: what
// one is called where no key names it, and its keys (its yaml tags).
type mapping struct{ noun, goType, keys string }

var (
	configMapping = mapping{"the configuration", fmt.Sprintf("%T", Config{}), "listen, admin, default_policy, " +
		"tier_header, key, trusted_proxies, client_ip_header, route_fold_case, ipv6_prefix, store, store_file, " +
		"store_options, upstream, shadow, check_deny_status, headers, decision_headers, max_body_bytes, max_batch, " +
		"max_header_bytes, max_conns, max_conns_per_ip, drain_delay, shutdown_timeout, read_timeout, " +
		"read_header_timeout, idle_timeout, write_timeout, upstream_header_timeout, admin_hosts, admin_token_file, " +
		"response_cost_header, top_counters, top_raw_keys, " +
		"drop_headers, policies, routes, grpc, tls, tracing"}
	grpcMapping    = mapping{"grpc", fmt.Sprintf("%T", GRPCConfig{}), "listen, envoy_config, envoy_headers, max_connections, max_keys, max_connection_idle, max_connection_age, max_connection_age_grace, cluster_tag, max_calls_per_address, call_timeout"}
	tlsMapping     = mapping{"tls", fmt.Sprintf("%T", TLSConfig{}), "cert_file, key_file, client_ca_file"}
	headersMapping = mapping{"headers", fmt.Sprintf("%T", HeadersConfig{}), "draft, x, retry_after"}
	policyMapping  = mapping{"a policy", fmt.Sprintf("%T", PolicyConfig{}), "name, limit, window, algorithm, max_keys, overflow, overrides"}
	routeMapping   = mapping{"a route", fmt.Sprintf("%T", RouteConfig{}), "method, path, limits, tiers, cluster_tag"}
	limitMapping   = mapping{"a limit", fmt.Sprintf("%T", LimitConfig{}), "policy, key"}
	mappings       = []*mapping{&configMapping, &grpcMapping, &tlsMapping, &headersMapping, &policyMapping, &routeMapping, &limitMapping, &tracingMapping}
)

// The plain types decode as the structs do, without their UnmarshalYAML.
type (
	plainConfig  Config
	plainGRPC    GRPCConfig
	plainTLS     TLSConfig
	plainHeaders HeadersConfig
	plainPolicy  PolicyConfig
	plainRoute   RouteConfig
	plainLimit   LimitConfig
)

// UnmarshalYAML reads the configuration's mapping.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainConfig)(c), &configMapping)
}

// UnmarshalYAML reads the grpc mapping.
func (g *GRPCConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainGRPC)(g), &grpcMapping)
}

// UnmarshalYAML reads the tls mapping.
func (t *TLSConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainTLS)(t), &tlsMapping)
}

// UnmarshalYAML reads a headers or decision_headers mapping.
func (h *HeadersConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainHeaders)(h), &headersMapping)
}

// UnmarshalYAML reads one policy.
func (p *PolicyConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainPolicy)(p), &policyMapping)
}

// UnmarshalYAML reads one route.
func (r *RouteConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainRoute)(r), &routeMapping)
}

// UnmarshalYAML reads one limit of a route.
func (l *LimitConfig) UnmarshalYAML(n *yaml.Node) error {
	return decodeMapping(n, (*plainLimit)(l), &limitMapping)
}

// decodeMapping decodes n, which must be a mapping of m's keys (those of
// the mappings its merge keys merge in included), into out.
func decodeMapping[T any](n *yaml.Node, out *T, m *mapping) error {
	top := m == &configMapping
	if n.Kind != yaml.MappingNode {
		want := "{" + m.keys + "}"
		if top {
			want = "of keys"
		}
		return mismatch(n, m.noun, "a mapping "+want)
	}
	ps := pairs(n)
	for _, p := range ps {
		switch {
		case slices.Contains(strings.Split(m.keys, ", "), p.key.Value):
		case top:
			return &nodeError{line: p.key.Line, before: "key " + p.key.Value + " not found", after: " (a top-level key; see slidegate serve --print-config)"}
		default:
			return &nodeError{node: n, line: p.key.Line, noun: m.noun, before: "key " + p.key.Value + " not found in ", after: " (want " + m.keys + ")"}
		}
	}
	if err := n.Decode(out); err != nil {
		return pairError[T](ps, err)
	}
	return nil
}

// typeErrorRE matches yaml.v3's refusal of a node for a field of a plain
// Go type: "line 3: cannot unmarshal !!map into []string".
var typeErrorRE = regexp.MustCompile("^line ([0-9]+): cannot unmarshal (.*) into (.*)$")

// pairError puts err, from decoding the pairs ps into a T, in the
// configuration's words: the first pair that fails alone names the key of
// the node refused.
func pairError[T any](ps []pair, err error) error {
	for _, p := range ps {
		decode := func(v *yaml.Node) error {
			var scratch T
			return (&yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Content: []*yaml.Node{p.key, v}}).Decode(&scratch)
		}
		e := decode(p.value)
		var ne *nodeError
		var te *yaml.TypeError
		if errors.As(e, &ne) && ne.key == "" && ne.node == Resolve(p.value) {
			ne.key = p.key.Value
		} else if errors.As(e, &te) {
			if m := typeErrorRE.FindStringSubmatch(te.Errors[0]); m != nil {
				line, _ := strconv.Atoi(m[1])
				fails := func(v *yaml.Node) bool { return errors.As(decode(v), &te) }
				return &nodeError{line: line, key: locate(p.key.Value, p.value, fails), before: "cannot unmarshal " + m[2] + " into ", after: " (" + describe(m[3]) + ")"}
			}
		}
		if e != nil {
			return e
		}
	}
	return err
}

// locate names the node of v, called name, that yaml.v3 refuses: v itself
// if an empty one of its kind fails, else the first item or entry that
// fails alone (trusted_proxies[1], tiers.pro). fails decodes a node in
// v's place.
func locate(name string, v *yaml.Node, fails func(*yaml.Node) bool) string {
	v = Resolve(v)
	if (v.Kind != yaml.SequenceNode && v.Kind != yaml.MappingNode) || fails(&yaml.Node{Kind: v.Kind, Tag: v.Tag}) {
		return name
	}
	for i, c := range v.Content {
		sub, key := fmt.Sprintf("%s[%d]", name, i), v.Content[:0]
		if v.Kind == yaml.MappingNode { // entries are a key and a value
			if i%2 == 0 {
				continue
			}
			sub, key = name+"."+Resolve(v.Content[i-1]).Value, v.Content[i-1:i]
		}
		item := func(c *yaml.Node) *yaml.Node {
			return &yaml.Node{Kind: v.Kind, Tag: v.Tag, Content: append(slices.Clone(key), c)}
		}
		if fails(item(c)) {
			return locate(sub, c, func(c *yaml.Node) bool { return fails(item(c)) })
		}
	}
	return name
}

// describe says what a field of goType (as yaml.v3 writes it) holds.
func describe(goType string) string {
	if elem, ok := strings.CutPrefix(goType, "[]"); ok {
		return "a list of " + strings.Replace(describe(elem), "a string", "strings", 1)
	}
	if elem, ok := strings.CutPrefix(goType, "map[string]"); ok && elem != "interface {}" {
		return "a mapping from name to " + describe(elem)
	} else if ok {
		return "a mapping"
	}
	for _, m := range mappings {
		if goType == m.goType {
			return "{" + m.keys + "}"
		}
	}
	if w, ok := scalarWords[goType]; ok {
		return w
	}
	return "a " + goType // string
}

// scalarWords say what the field types hold, in the configuration's words
// rather than Go's: yaml.v3 names a map's element type (overrides) and a
// type without its own reader (default_policy) when it refuses a node.
var scalarWords = map[string]string{
	fmt.Sprintf("%T", Int(0)):          "a whole number",
	fmt.Sprintf("%T", Bool(false)):     "true or false",
	fmt.Sprintf("%T", Duration(0)):     "a duration with a unit, such as 60s, 1m30s or 24h",
	fmt.Sprintf("%T", ByteSize(0)):     "a size in bytes, such as 65536 or 64KiB",
	fmt.Sprintf("%T", UpstreamURL("")): "an http:// or https:// URL with a host",
	fmt.Sprintf("%T", PolicyName("")):  "the name of a policy",
}

// mismatch refuses node n, of a kind (or tag) that what it is read into
// does not take.
func mismatch(n *yaml.Node, noun, want string) error {
	got := n.Tag
	if n.Kind == yaml.ScalarNode {
		got += " `" + n.Value + "`"
	}
	return &nodeError{node: n, line: n.Line, noun: noun, before: "cannot unmarshal " + got + " into ", after: " (" + want + ")"}
}

// A pair is one key and its value in a mapping.
type pair struct{ key, value *yaml.Node }

// pairs Lists the pairs of mapping n, those of the mappings its merge keys
// (<<: *base, or a list of them) merge in included.
func pairs(n *yaml.Node) []pair {
	var out []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := Resolve(n.Content[i]), Resolve(n.Content[i+1]); k.Tag != "!!merge" {
			out = append(out, pair{k, n.Content[i+1]})
		} else if v.Kind == yaml.MappingNode {
			out = append(out, pairs(v)...)
		} else if v.Kind == yaml.SequenceNode {
			for _, m := range v.Content {
				if m = Resolve(m); m.Kind == yaml.MappingNode {
					out = append(out, pairs(m)...)
				} // else yaml.v3 refuses the merge
			}
		}
	}
	return out
}

// Resolve returns the node alias n stands for, or n itself. An anchor
// cannot be put on an alias, so one step is enough.
func Resolve(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// maxNodes bounds the nodes of a configuration with its aliases expanded:
// aliases of aliases can stand for far more nodes than a file holds
// (billion laughs), and yaml.v3's own limit on them sees only the nodes
// one struct decodes, not the whole file.
const maxNodes = 1_000_000

// ExpandedNodes returns the number of nodes n stands for with its aliases
// expanded, or most+1 if that is more or n holds an alias of itself. It
// visits each node of the file once, however often aliases repeat it.
// The Envoy rate limit service bounds its files with it too.
func ExpandedNodes(n *yaml.Node, most int) int {
	return expanded(n, most, map[*yaml.Node]int{})
}

// expanded is ExpandedNodes; seen holds the counts of the nodes already
// counted.
func expanded(n *yaml.Node, most int, seen map[*yaml.Node]int) int {
	n = Resolve(n)
	if c, ok := seen[n]; ok {
		return c
	}
	seen[n] = most + 1 // while its children are counted
	c := 1
	for _, child := range n.Content {
		c = min(c+expanded(child, most, seen), most+1)
	}
	seen[n] = c
	return c
}

// nodeError refuses one node of the configuration, naming it by the key
// it is under (which the mapping holding it sets) or else by what it is
// called (a route, a limit).
type nodeError struct {
	node          *yaml.Node
	line          int
	key, noun     string
	before, after string // the message around the name
}

func (e *nodeError) Error() string {
	return fmt.Sprintf("line %d: %s%s%s", e.line, e.before, cmp.Or(e.key, e.noun), e.after)
}
