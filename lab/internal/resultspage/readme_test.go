package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMESnippetsCompile builds every Go snippet of the README against
// this tree, each as the body of a function, so that the README cannot
// show an API that does not exist.
func TestREADMESnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(mustRead(t, filepath.Join(root, "README.md")))
	snippets := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(readme, -1)
	if len(snippets) < 3 {
		t.Fatalf("README has %d Go snippets", len(snippets))
	}
	dir := t.TempDir()
	gomod := fmt.Sprintf("module snippets\n\ngo 1.26\n\nrequire github.com/slidegate/slidegate v0.0.0\n\nreplace github.com/slidegate/slidegate => %s\n", root)
	files := map[string]string{"go.mod": gomod, "go.sum": string(mustRead(t, filepath.Join(root, "go.sum")))}
	pkgs := map[string]string{"engine.": "github.com/slidegate/slidegate/engine", "httplimit.": "github.com/slidegate/slidegate/httplimit",
		"time.": "time", "http.": "net/http"}
	for i, s := range snippets {
		var imports []string
		for use, path := range pkgs {
			if strings.Contains(s[1], use) {
				imports = append(imports, fmt.Sprintf("%q", path))
			}
		}
		files[fmt.Sprintf("snippet%d.go", i)] = fmt.Sprintf("package snippets\n\nimport (\n%s\n)\n\n// README snippet %d.\nfunc snippet%d(apiKey string, mux *http.ServeMux) error {\n%s\treturn nil\n}\n",
			strings.Join(imports, "\n"), i+1, i, s[1])
		if !strings.Contains(s[1], "http.") {
			files[fmt.Sprintf("snippet%d.go", i)] = strings.Replace(files[fmt.Sprintf("snippet%d.go", i)], "import (\n", "import (\n\"net/http\"\n", 1)
		}
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(gobin, "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("README's Go snippets do not build: %v\n%s", err, out)
	}
}
