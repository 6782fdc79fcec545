package redact

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

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
		// URLs that do not parse: a base64 password with / and +, a #, a
		// space, a quote; quoted by %q in an error message.
		"redis://:Zm9v/YmFy+S3cr3t@127.0.0.1:6379/0":                 "redis://:xxxxx@127.0.0.1:6379/0",
		`store: "redis://:Zm9v/YmFy+S3cr3t@127.0.0.1:6379/0" is bad`: `store: "redis://:xxxxx@127.0.0.1:6379/0" is bad`,
		"redis://:ab#cd@h:1/0":                                       "redis://:xxxxx@h:1/0",
		"redis://:a b c@h:1/0 and more":                              "redis://:xxxxx@h:1/0 and more",
		`store "redis://:a\"b/c@h:1/0" x`:                            `store "redis://:xxxxx@h:1/0" x`,
		"redis://u:a/b@h:1 then rediss://:c/d@k:2":                   "redis://u:xxxxx@h:1 then rediss://:xxxxx@k:2",
		"redis://tok/en@h:1/0":                                       "redis://xxxxx@h:1/0",
	} {
		if got := URLs(in); got != want {
			t.Errorf("URLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestURLsNeverShowsThePassword: whatever bytes a password holds, the
// redacted text of a URL carrying it does not contain it.
func TestURLsNeverShowsThePassword(t *testing.T) {
	for _, pw := range []string{"Zm9v/YmFy+S3cr3t", "a#b", "a b", `a"b`, "a?b/c", "p@ss/w", "x:y/z", "%zz", "a\tb", "1234/x"} {
		for _, f := range []string{"redis://:%s@127.0.0.1:6379/0", "rediss://user:%s@h:1", "store %q: bad"} {
			u := strings.Replace(f, "%s", pw, 1)
			if f == "store %q: bad" {
				u = "store \"redis://:" + pw + "@h:1/0\": bad"
			}
			if got := URLs(u); strings.Contains(got, pw) {
				t.Errorf("URLs(%q) = %q shows the password", u, got)
			}
		}
	}
}

func TestKey(t *testing.T) {
	k := "sk_live_0123456789abcdef"
	sum := sha256.Sum256([]byte(k))
	want := "sha256:" + hex.EncodeToString(sum[:])[:16]
	if got := Key(k); got != want || strings.Contains(got, "sk_live") {
		t.Errorf("Key(%q) = %q, want %q", k, got, want)
	}
	if Key("a") == Key("b") {
		t.Error("two keys, one hash")
	}
}

// TestOptions: every credential among a store's options is hidden, in
// nested maps too; other values stay as they are, and the input map is
// not changed.
func TestOptions(t *testing.T) {
	in := map[string]any{
		"sentinel_password": "s3ntinel",
		"sentinel_username": "admin",
		"Password":          "p4ss",
		"auth_token":        12345,
		"client_secret":     []any{"a", "b"},
		"empty_password":    "",
		"key_prefix":        "sg:",
		"timeout":           "1s",
		"fallback":          "redis://:inurl@h:1/0",
		"nested":            map[string]any{"password": "deep", "list": []any{"redis://u:x@h"}},
	}
	out := Options(in)
	want := map[string]any{
		"sentinel_password": "xxxxx",
		"sentinel_username": "admin",
		"Password":          "xxxxx",
		"auth_token":        "xxxxx",
		"client_secret":     "xxxxx",
		"empty_password":    "",
		"key_prefix":        "sg:",
		"timeout":           "1s",
		"fallback":          "redis://:xxxxx@h:1/0",
	}
	for k, w := range want {
		if out[k] != w {
			t.Errorf("%s: %v, want %v", k, out[k], w)
		}
	}
	n := out["nested"].(map[string]any)
	if n["password"] != "xxxxx" || n["list"].([]any)[0] != "redis://u:xxxxx@h" {
		t.Errorf("nested: %v", n)
	}
	if in["sentinel_password"] != "s3ntinel" || in["nested"].(map[string]any)["password"] != "deep" {
		t.Errorf("Options changed its input: %v", in)
	}
	if Options(nil) != nil {
		t.Error("Options(nil) is not nil")
	}
}
