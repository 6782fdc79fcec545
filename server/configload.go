package server

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/internal/redact"
)

// DefaultConfig returns the embedded default configuration: its policies
// as written, every other key at its default (the Default* constants).
func DefaultConfig() Config {
	c, err := ParseConfig(defaultYAML)
	if err != nil {
		panic("server: embedded default.yaml is invalid: " + err.Error())
	}
	d := c.withDefaults()
	d.Policies = c.Policies
	return d
}

// LoadConfig reads and validates a YAML configuration file.
func LoadConfig(path string) (Config, error) {
	c, err := ReadConfig(path)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ReadConfig reads a YAML configuration file as DecodeConfig does,
// without validating it: for callers that override fields (slidegate
// serve's flags) and validate the result.
func ReadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := DecodeConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and validates YAML. Unknown keys are errors, so that
// a misspelt key does not silently take its default.
//
// A file holds one YAML document: a second one (after ---) is an error,
// not silently ignored. Integer keys given a fraction (limit: 2.5) and
// durations without a unit (window: 60) are errors rather than truncated
// or read as nanoseconds.
func ParseConfig(data []byte) (Config, error) {
	c, err := DecodeConfig(data)
	if err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// DecodeConfig is ParseConfig without the validation: the YAML itself is
// checked (unknown keys, fractions for integers, a second document), the
// values are not.
func DecodeConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var root yaml.Node
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return Config{}, fmt.Errorf("%w: line %d: a second YAML document (after ---): a configuration is one document", ErrConfig, extra.Line)
	} else if !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := checkScalars(&root); err != nil {
		return Config{}, err
	}
	if err := checkShape(&root, reflect.TypeFor[Config](), "the configuration"); err != nil {
		return Config{}, err
	}
	if root.Kind != 0 {
		// Decode again from the bytes: yaml.Node.Decode does not check
		// for unknown keys.
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("%w: %w", ErrConfig, err) // checkShape has passed: not expected
		}
	}
	return c, nil
}

// checkScalars reports a scalar of the wrong kind under a known key: a
// fraction or text where a whole number belongs (the YAML decoder would
// truncate 2.5 to 2), anything but true or false for a switch, and a
// duration without a unit (the decoder would read "60" as 60 ns).
func checkScalars(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
				continue
			}
			bad := func(want string) error {
				return fmt.Errorf("%w: line %d: %s: %q is not %s", ErrConfig, v.Line, k.Value, v.Value, want)
			}
			switch {
			case integerKeys[k.Value] && v.Tag != "!!int":
				return bad("a whole number")
			case boolKeys[k.Value] && v.Tag != "!!bool":
				return bad("true or false")
			case durationKeys[k.Value]:
				if _, err := time.ParseDuration(v.Value); err != nil {
					return bad("a duration with a unit, such as 60s, 1m30s or 24h")
				}
			}
		}
	}
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 1 && n.Content[i-1].Value == "store_options" {
			continue // the store's own keys, checked by the store
		}
		if err := checkScalars(c); err != nil {
			return err
		}
	}
	return nil
}

// Marshal renders c, defaults filled in, as YAML (slidegate serve
// --print-config). A password in the store URL is redacted: keep it in
// store_file or the environment.
func (c Config) Marshal() ([]byte, error) {
	c = c.withDefaults()
	c.Store = redact.URLs(c.Store)
	return yaml.Marshal(c)
}
