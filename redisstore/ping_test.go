package redisstore

import (
	"context"
	"testing"
	"time"
)

// TestPing: Ping answers nil while the server runs, an error naming the
// address once it is killed, and nil again once it is back on its port
// (the client reconnects by itself).
func TestPing(t *testing.T) {
	needRedis(t)
	p := startRedis(t, false)
	defer p.stop()
	st, err := Open("redis://" + p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return st.Ping(ctx)
	}
	if err := ping(); err != nil {
		t.Fatalf("Ping with the server up: %v", err)
	}
	p.kill()
	if err := ping(); err == nil {
		t.Fatal("Ping with the server killed: nil, want an error")
	}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second) // a hang bound
	for {
		err := ping()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ping with the server back: %v after 30 s", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
