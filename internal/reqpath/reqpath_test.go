package reqpath

import "testing"

func TestClean(t *testing.T) {
	for _, c := range []struct {
		in   string
		fold bool
		want string
	}{
		{"", false, "/"},
		{"/", false, "/"},
		{"//a/./b/", false, "/a/b"},
		{"/login;jsessionid=1", false, "/login"},
		{"/login;", false, "/login"},
		{"/a;x=1/b;y=2/c", false, "/a/b/c"},
		{"/x/..;/login", false, "/login"},
		{"/api;v=1/../admin", false, "/admin"},
		{";x/login", false, "/login"},
		{"/A;B/C", true, "/a/c"},
		{"/a/b", false, "/a/b"},
	} {
		if got := Clean(c.in, c.fold); got != c.want {
			t.Errorf("Clean(%q, %v) = %q, want %q", c.in, c.fold, got, c.want)
		}
	}
}

func TestMethod(t *testing.T) {
	for in, want := range map[string]string{"HEAD": "GET", "GET": "GET", "POST": "POST", "head": "head"} {
		if got := Method(in); got != want {
			t.Errorf("Method(%q) = %q, want %q", in, got, want)
		}
	}
	for m, want := range map[string]bool{"GET": true, "POST": true, "M-SEARCH": true, "post": false, "Post": false, "gET": false} {
		if got := Canonical(m); got != want {
			t.Errorf("Canonical(%q) = %v, want %v", m, got, want)
		}
	}
}

func BenchmarkClean(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = Clean("/api/v1/items", false)
	}
}
