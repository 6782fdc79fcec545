package loadtest

import (
	"testing"
)

func TestClientKeyRoundTrip(t *testing.T) {
	for _, i := range []int{0, 1, 9, 10, 999_999, maxClients - 1} {
		k := clientKey(i)
		got, ok := clientIndex(k)
		if !ok || got != i {
			t.Errorf("clientIndex(%q) = %d, %v; want %d", k, got, ok, i)
		}
	}
	for _, k := range []string{"", "client-", "client-x", "client-01", "client--1", "other-1", "client-1 ", "client-+1", "client-1_0", "client-99999999999999999999"} {
		if i, ok := clientIndex(k); ok {
			t.Errorf("clientIndex(%q) = %d, true; want false", k, i)
		}
	}
}
