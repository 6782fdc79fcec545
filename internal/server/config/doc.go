// Package config is the configuration of slidegate serve: its types, how
// they read YAML, their defaults and their validation. It knows nothing
// of the server's runtime (no handlers, no stores, no metrics), which
// imports it; the Envoy rate limit service reads its own YAML with the
// same helpers.
//
// A configuration comes from ParseConfig or LoadConfig, defaults filled
// in and validated. Errors wrap ErrConfig and name the line and the key,
// or the field, at fault.
package config
