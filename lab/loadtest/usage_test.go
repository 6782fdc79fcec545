package loadtest

import (
	"context"
	"io"
	"testing"
)

// TestMainBadFlag: a bad flag stops the lab's binary with the usage exit
// status before any load.
func TestMainBadFlag(t *testing.T) {
	if code := Main(context.Background(), []string{"--http-rate", "0"}, io.Discard, io.Discard); code != exitUsage {
		t.Errorf("--http-rate 0: exit %d, want %d", code, exitUsage)
	}
}
