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
		// An unescaped @ in the password or the user name: url.Parse
		// splits the userinfo at the last @ before the host.
		"redis://:p@ss@host:6379/0":        "redis://:xxxxx@host:6379/0",
		"dial redis://us@er:pw@h:1: boom":  "dial redis://us@er:xxxxx@h:1: boom",
		"redis://u:p@s@h and redis://:q@k": "redis://u:xxxxx@h and redis://:xxxxx@k",
		"redis://host:6379/0?x=a@b":        "redis://host:6379/0?x=a@b",
		"redis://host:6379?x=a@b":          "redis://host:6379?x=a@b",
	} {
		if got := URLs(in); got != want {
			t.Errorf("URLs(%q) = %q, want %q", in, got, want)
		}
	}
}
