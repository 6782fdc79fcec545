package loadtest

import (
	"bytes"
	"os"
	"sync/atomic"
	"testing"
)

// TestProgressQuietOffTerminal: bars draw only when asked or when stdout
// is a terminal; a pipe or buffer stays clean.
func TestProgressQuietOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	if newUI("auto", &buf).enabled {
		t.Error("auto: enabled on a buffer")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if newUI("auto", w).enabled {
		t.Error("auto: enabled on a pipe")
	}
	if newUI("off", w).enabled {
		t.Error("off: enabled")
	}

	u := newUI("on", &buf)
	var n atomic.Int64
	n.Store(50)
	b := u.bar(100, "phase", &n)
	b.finish()
	if !bytes.Contains(buf.Bytes(), []byte("phase")) {
		t.Errorf("on: nothing drawn: %q", buf.String())
	}
	// A disabled bar is a no-op.
	newUI("off", &buf).bar(10, "x", &n).finish()
}
