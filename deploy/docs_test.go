package deploy_test

import (
	"strings"
	"testing"
)

// TestDocsQuoteDeployFiles: docs/integrations.md shows the configurations
// the tests run, byte for byte, so that what a user copies is what was
// tested.
func TestDocsQuoteDeployFiles(t *testing.T) {
	docs := map[string][]string{
		"../docs/integrations.md": {"nginx/slidegate.conf", "nginx/slidegate.yaml", "caddy/Caddyfile", "caddy/slidegate.yaml",
			"Dockerfile", "kubernetes/slidegate.yaml", "systemd/slidegate.service"},
	}
	for doc, files := range docs {
		text := readFile(t, doc)
		for _, f := range files {
			if !strings.Contains(text, "\n"+readFile(t, f)+"```") {
				t.Errorf("%s does not quote deploy/%s exactly", doc, f)
			}
		}
	}
}
