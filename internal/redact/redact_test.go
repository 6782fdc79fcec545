package redact

import "testing"

func TestURLs(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:secret@host:6379/0":                  "redis://:xxxxx@host:6379/0",
		"dial redis://user:p%40ss@10.0.0.1:6379: boom": "dial redis://user:xxxxx@10.0.0.1:6379: boom",
		"a rediss://u:x@h and redis://:y@k":            "a rediss://u:xxxxx@h and redis://:xxxxx@k",
		"redis://host:6379/0":                          "redis://host:6379/0",
		"redis://user@host":                            "redis://user@host",
		"no url here: a:b@c":                           "no url here: a:b@c",
	} {
		if got := URLs(in); got != want {
			t.Errorf("URLs(%q) = %q, want %q", in, got, want)
		}
	}
}
