package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestMappingKeys: each mapping's keys are its struct's yaml keys, in
// order, so that the keys refused and the keys listed are the decoder's.
func TestMappingKeys(t *testing.T) {
	for _, c := range []struct {
		m *mapping
		t reflect.Type
	}{
		{&configMapping, reflect.TypeFor[Config]()}, {&grpcMapping, reflect.TypeFor[GRPCConfig]()},
		{&tlsMapping, reflect.TypeFor[TLSConfig]()}, {&headersMapping, reflect.TypeFor[HeadersConfig]()},
		{&policyMapping, reflect.TypeFor[PolicyConfig]()}, {&routeMapping, reflect.TypeFor[RouteConfig]()},
		{&limitMapping, reflect.TypeFor[LimitConfig]()}, {&tracingMapping, reflect.TypeFor[TracingConfig]()},
	} {
		var tags []string
		for i := range c.t.NumField() {
			if name, _, _ := strings.Cut(c.t.Field(i).Tag.Get("yaml"), ","); name != "-" && c.t.Field(i).IsExported() {
				tags = append(tags, name)
			}
		}
		if c.m.keys != strings.Join(tags, ", ") || c.m.goType != c.t.String() {
			t.Errorf("%s: mapping keys %v (%s), yaml tags %v", c.t, c.m.keys, c.m.goType, tags)
		}
	}
	if len(mappings) != 8 {
		t.Errorf("%d mappings listed for describe, want 8", len(mappings))
	}
}
