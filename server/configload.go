package server

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/internal/redact"
)

// DefaultConfig returns the embedded default configuration: its policies
// as written, every other key at its default (the Default* constants).
func DefaultConfig() Config {
	c, err := parse(defaultYAML)
	if err != nil {
		panic("server: embedded default.yaml is invalid: " + err.Error())
	}
	d := c.withDefaults()
	d.Policies = c.Policies
	return d
}

// LoadConfig reads a YAML configuration file as ParseConfig does; errors
// name the file.
func LoadConfig(path string, edits ...func(*Config)) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c, err := ParseConfig(data, edits...)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig parses and validates YAML, and returns the configuration
// with every key not given at its default: what a server built from it
// runs. Unknown keys are errors, so that a misspelt key does not silently
// take its default.
//
// A file holds one YAML document: a second one (after ---) is an error,
// not silently ignored. Each value is read by its field's type, which
// refuses what the decoder would misread: a fraction for a whole number
// (limit: 2.5), a duration without a unit (window: 60), a switch other
// than true or false, an upstream that is not an http(s) URL. Errors name
// the line and the key.
//
// Each edit changes the configuration read before it is validated, in
// order: slidegate serve applies its flags so, as a flag may complete what
// the file alone is not (store_options for a --store URL).
func ParseConfig(data []byte, edits ...func(*Config)) (Config, error) {
	c, err := parse(data, edits...)
	if err != nil {
		return Config{}, err
	}
	return c.withDefaults(), nil
}

// parse is ParseConfig without the defaults filled in.
func parse(data []byte, edits ...func(*Config)) (Config, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return Config{}, fmt.Errorf("%w: line %d: a second YAML document (after ---): a configuration is one document", ErrConfig, extra.Line)
	} else if !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := checkShape(&root, reflect.TypeFor[Config](), "the configuration"); err != nil {
		return Config{}, err
	}
	var c Config
	if root.Kind != 0 {
		// Decode again from the bytes: yaml.Node.Decode does not check
		// for unknown keys.
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			var se *scalarError
			if errors.As(err, &se) {
				return Config{}, fmt.Errorf("%w: line %d: %s: %q is not %s", ErrConfig, se.line, keyOf(&root, se.line, se.column), se.value, se.want)
			}
			return Config{}, fmt.Errorf("%w: %w", ErrConfig, err) // checkShape has passed: not expected
		}
	}
	for _, edit := range edits {
		edit(&c)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// keyOf returns the key whose value starts at line and column in the tree
// of n, or "" if none does.
func keyOf(n *yaml.Node, line, column int) string {
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 1 && c.Line == line && c.Column == column {
			return n.Content[i-1].Value
		}
		if k := keyOf(c, line, column); k != "" {
			return k
		}
	}
	return ""
}

// Marshal renders c, defaults filled in, as YAML (slidegate serve
// --print-config). A password in the store URL is redacted: keep it in
// store_file or the environment.
func (c Config) Marshal() ([]byte, error) {
	c = c.withDefaults()
	if c.Store == DefaultStore && c.StoreFile == "" {
		for i := range c.Policies { // a copy (withDefaults)
			c.Policies[i] = c.Policies[i].withKeyCap()
		}
	}
	c.Store = redact.URLs(c.Store)
	return yaml.Marshal(c)
}
