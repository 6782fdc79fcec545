package config

// DefaultYAML is the embedded default.yaml, for the configuration fuzzer's
// seed corpus. Tests only.
func DefaultYAML() []byte { return defaultYAML }
