package main

import (
	"io"
	"testing"
)

// TestLoadtestRegistered: slidegate loadtest is a command, and bad flags
// stop it with the usage exit status before any load.
func TestLoadtestRegistered(t *testing.T) {
	if _, ok := commands["loadtest"]; !ok {
		t.Fatal("loadtest is not registered")
	}
	if code := dispatch([]string{"loadtest", "--http-rate", "0"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("loadtest --http-rate 0: exit %d, want 2", code)
	}
}
