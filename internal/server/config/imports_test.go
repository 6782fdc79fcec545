package config_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNoRuntime: the configuration imports the standard library,
// the YAML decoder and the core's packages only, never the server's
// runtime, a store or metrics, so that the runtime depends on it one way.
func TestImportsNoRuntime(t *testing.T) {
	allowed := map[string]bool{
		"go.yaml.in/yaml/v3":                              true,
		"github.com/slidegate/slidegate/engine":           true,
		"github.com/slidegate/slidegate/httplimit":        true,
		"github.com/slidegate/slidegate/internal/httpkit": true,
		"github.com/slidegate/slidegate/internal/reqpath": true,
		"github.com/slidegate/slidegate/internal/redact":  true,
		"github.com/slidegate/slidegate/internal/topk":    true,
	}
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files: %v", err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue // tests may use what they like
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.Contains(strings.SplitN(p, "/", 2)[0], ".") {
				continue // the standard library
			}
			if !allowed[p] {
				t.Errorf("%s imports %s: the configuration imports nothing of the runtime", f, p)
			}
		}
	}
}
