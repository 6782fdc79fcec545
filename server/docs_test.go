package server_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/slidegate/slidegate/server"
)

// TestEveryKeyDocumented: every top-level configuration key has a row in
// docs/operations.md's key table, so that no bound goes undocumented.
func TestEveryKeyDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	ct := reflect.TypeFor[server.Config]()
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
