package redisstore

import "testing"

// TestVersionAtLeast: Open refuses servers older than 6.2 by the
// redis_version INFO gives.
func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{
		{"7.0.15", true}, {"6.2.0", true}, {"6.2", true}, {"10.0.0", true},
		{"6.0.20", false}, {"5.0.14", false}, {"6.1.9", false},
		{"", true}, {"garbage", true}, {"x.y.z", true},
	} {
		if got := versionAtLeast(c.v, 6, 2); got != c.want {
			t.Errorf("versionAtLeast(%q, 6, 2) = %v, want %v", c.v, got, c.want)
		}
	}
}
