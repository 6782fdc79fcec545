package config

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// The configuration's field types check their own YAML scalars, so that a
// mistake is refused with its line and key (LoadConfig, ParseConfig)
// instead of being truncated or misread by the decoder.

// Duration is a configuration duration. In YAML it is a number with a unit
// ("60s", "1m30s", "24h"): a bare number is refused, as the decoder would
// read 60 as 60 nanoseconds. It is also a flag.Value, so that serve's
// duration flags say the same.
type Duration time.Duration

// ParseDuration parses s as a Duration, refusing a number without a unit.
func ParseDuration(s string) (Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration with a unit, such as 60s, 1m30s or 24h", s)
	}
	return Duration(d), nil
}

// String formats d as time.Duration does ("1m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// Set parses s (flag.Value).
func (d *Duration) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// UnmarshalYAML reads a duration with a unit.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseDuration(n.Value)
	if err != nil {
		return scalarErr(n, "a duration with a unit, such as 60s, 1m30s or 24h")
	}
	*d = v
	return nil
}

// MarshalYAML writes d as a duration with a unit.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// Int is a whole number of the configuration: in YAML, a fraction (2.5),
// an exponent (1e2) or text is refused rather than truncated.
type Int int

// UnmarshalYAML reads a whole number.
func (i *Int) UnmarshalYAML(n *yaml.Node) error {
	if n.Tag != "!!int" {
		return scalarErr(n, "a whole number")
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, strconv.IntSize)
	if err != nil {
		return scalarErr(n, "a whole number in range")
	}
	*i = Int(v)
	return nil
}

// Bool is a switch of the configuration: in YAML, true or false only
// (yes, on or 1 are refused: YAML versions disagree on them).
type Bool bool

// UnmarshalYAML reads true or false.
func (b *Bool) UnmarshalYAML(n *yaml.Node) error {
	switch {
	case n.Tag != "!!bool":
		return scalarErr(n, "true or false")
	case n.Value == "true", n.Value == "True", n.Value == "TRUE":
		*b = true
	case n.Value == "false", n.Value == "False", n.Value == "FALSE":
		*b = false
	default:
		return scalarErr(n, "true or false")
	}
	return nil
}

// ByteSize is a number of bytes: in YAML, a whole number (65536) or one
// with a binary unit (64KiB, 1MiB, 1GiB).
type ByteSize int64

// byteUnits are ByteSize's units, longest first so that "KiB" is not read
// as "B".
var byteUnits = []struct {
	suffix string
	n      int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// ParseByteSize parses a whole number of bytes, optionally with a binary
// unit.
func ParseByteSize(s string) (ByteSize, error) {
	num, mul := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, mul = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.n
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v > (1<<62)/mul || v < -(1<<62)/mul {
		return 0, fmt.Errorf("%q is not a size in bytes, such as 65536 or 64KiB", s)
	}
	return ByteSize(v * mul), nil
}

// UnmarshalYAML reads a size in bytes.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!str") {
		return scalarErr(n, "a size in bytes, such as 65536 or 64KiB")
	}
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return scalarErr(n, "a size in bytes, such as 65536 or 64KiB")
	}
	*b = v
	return nil
}

// UpstreamURL is the gateway's upstream: an http:// or https:// URL with a
// host. It parses itself when read from YAML, and Validate parses one set
// in code.
type UpstreamURL string

// Parse returns u as a URL, or why it is not an upstream.
func (u UpstreamURL) Parse() (*url.URL, error) {
	p, err := url.Parse(string(u))
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return nil, fmt.Errorf("%q is not an http:// or https:// URL with a host", string(u))
	}
	return p, nil
}

// UnmarshalYAML reads an upstream URL.
func (u *UpstreamURL) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return scalarErr(n, "an http:// or https:// URL with a host")
	}
	v := UpstreamURL(n.Value)
	if n.Tag == "!!null" {
		v = ""
	}
	if _, err := v.Parse(); err != nil && v != "" {
		return scalarErr(n, "an http:// or https:// URL with a host")
	}
	*u = v
	return nil
}

// PolicyName names a policy of the configuration: where one is referred
// to (default_policy, a route's limits), resolve finds it.
type PolicyName string

// resolve reports whether n names one of the policies (by name).
func (n PolicyName) resolve(policies map[string]bool) bool { return policies[string(n)] }

// scalarErr refuses node n of a field that wants a scalar; the mapping
// holding n names its key.
func scalarErr(n *yaml.Node, want string) error {
	if n.Kind != yaml.ScalarNode {
		return mismatch(n, "", want)
	}
	return &nodeError{node: n, line: n.Line, after: fmt.Sprintf(": %q is not %s", n.Value, want)}
}
