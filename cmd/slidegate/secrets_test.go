package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestPrintConfigHidesUnparsablePasswords: a store
// URL that does not parse (base64 passwords hold / and +; # and spaces
// get pasted) is refused by --print-config without its password, from
// the flag and from $SLIDEGATE_STORE alike.
func TestPrintConfigHidesUnparsablePasswords(t *testing.T) {
	for _, u := range []string{
		"redis://:Zm9v/YmFy+S3cr3t@127.0.0.1:6379/0",
		"redis://:S3cr3t#x@127.0.0.1:6379/0",
		"redis://:S3cr3t with space@127.0.0.1:6379/0",
		"//:S3cr3t@127.0.0.1:6379",
		"redis://:S3cr3t@127.0.0.1:6379/0", // parses: printed redacted
	} {
		var out, errOut bytes.Buffer
		serve(context.Background(), []string{"--store", u, "--print-config"}, &out, &errOut)
		if strings.Contains(out.String()+errOut.String(), "S3cr3t") {
			t.Errorf("--store %q --print-config shows the password:\n%s%s", u, out.String(), errOut.String())
		}
		t.Setenv("SLIDEGATE_STORE", u)
		out.Reset()
		errOut.Reset()
		serve(context.Background(), []string{"--print-config"}, &out, &errOut)
		if strings.Contains(out.String()+errOut.String(), "S3cr3t") {
			t.Errorf("SLIDEGATE_STORE=%q --print-config shows the password:\n%s%s", u, out.String(), errOut.String())
		}
	}
}
