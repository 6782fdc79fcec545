package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"

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
	d := c.WithDefaults()
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
// the line and the key. Aliases (*name) and merge keys (<<) are read as
// YAML defines them, but a file whose aliases stand for more than a
// million nodes in all is refused before it is decoded.
//
// Each edit changes the configuration read before it is validated, in
// order: slidegate serve applies its flags so, as a flag may complete what
// the file alone is not (store_options for a --store URL).
func ParseConfig(data []byte, edits ...func(*Config)) (Config, error) {
	c, err := parse(data, edits...)
	if err != nil {
		return Config{}, err
	}
	return c.WithDefaults(), nil
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
	if ExpandedNodes(&root, maxNodes) > maxNodes {
		return Config{}, fmt.Errorf("%w: aliases expand the configuration past %d nodes (or an alias is inside its own anchor)", ErrConfig, maxNodes)
	}
	var c Config
	if err := root.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	for _, edit := range edits {
		edit(&c)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Marshal renders c, defaults filled in, as YAML (slidegate serve
// --print-config). Secrets are redacted: the password of the store URL
// and of the upstream URL, and every store option named as a credential
// (sentinel_password and the like; see redact.Secret). Keep secrets in
// store_file or the environment.
func (c Config) Marshal() ([]byte, error) {
	c = c.WithDefaults()
	if c.Store == DefaultStore && c.StoreFile == "" {
		for i := range c.Policies { // a copy (WithDefaults)
			c.Policies[i] = c.Policies[i].WithKeyCap()
		}
		if c.GRPC.MaxKeys == 0 {
			c.GRPC.MaxKeys = DefaultMaxKeys
		}
	}
	c.Store = redact.URLs(c.Store)
	c.Upstream = UpstreamURL(redact.URLs(string(c.Upstream)))
	c.StoreOptions = redact.Options(c.StoreOptions)
	return yaml.Marshal(c)
}
