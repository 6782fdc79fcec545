package config_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/slidegate/slidegate/internal/server/config"
)

// TestEveryKeyDocumented: every top-level configuration key has a row in
// docs/operations.md's key table, so that no bound goes undocumented.
func TestEveryKeyDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	ct := reflect.TypeFor[config.Config]()
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if !strings.Contains(string(doc), "| `"+name+"` |") {
			t.Errorf("docs/operations.md has no row for %s", name)
		}
	}
}

// TestPrintConfigEveryKey: --print-config (Config.Marshal) prints every
// documented key, the grpc and tls sections' keys too, even when empty,
// and what it prints parses back.
func TestPrintConfigEveryKey(t *testing.T) {
	out, err := config.DefaultConfig().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var printed map[string]any
	if err := yaml.Unmarshal(out, &printed); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []struct {
		t       reflect.Type
		section string
	}{{reflect.TypeFor[config.Config](), ""}, {reflect.TypeFor[config.GRPCConfig](), "grpc"}, {reflect.TypeFor[config.TLSConfig](), "tls"}} {
		keys := printed
		if typ.section != "" {
			keys, _ = printed[typ.section].(map[string]any)
		}
		for i := range typ.t.NumField() {
			name, _, _ := strings.Cut(typ.t.Field(i).Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			if _, ok := keys[name]; !ok {
				t.Errorf("--print-config leaves out %s", strings.TrimPrefix(typ.section+"."+name, "."))
			}
		}
	}
	if _, err := config.ParseConfig(out); err != nil {
		t.Errorf("printed configuration does not parse: %v\n%s", err, out)
	}
}
