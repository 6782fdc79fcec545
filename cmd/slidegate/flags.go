package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// parseFlags parses args with fs for the command cmd ("slidegate serve").
// Help (-h, -help, --help) prints usage to stdout and returns 0. A bad
// flag prints one line of error, with the nearest flag when one is close,
// and one line pointing at --help, to stderr, and returns 2: the whole
// usage would bury the error. ok is false in both cases.
func parseFlags(fs *flag.FlagSet, cmd string, usage func(w io.Writer), args []string, stdout, stderr io.Writer) (ok bool, code int) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return true, 0
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		usage(stdout)
		return false, 0
	}
	msg := err.Error()
	if name, found := strings.CutPrefix(msg, "flag provided but not defined: "); found {
		name = strings.TrimLeft(name, "-")
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		msg = "flag provided but not defined: --" + name
		if s := nearest(name, names); s != "" {
			msg += "; did you mean --" + s + "?"
		}
	}
	if m := invalidValue.FindStringSubmatch(msg); m != nil {
		msg = "--" + m[2] + " " + m[1] + ": " + m[3]
		if strings.Contains(m[3], m[1]) {
			msg = "--" + m[2] + ": " + m[3]
		}
	}
	fmt.Fprintf(stderr, "%s: %s\n", cmd, msg)
	fmt.Fprintf(stderr, "Run '%s --help' for the flags.\n", cmd)
	return false, 2
}

// invalidValue is the flag package's error for a value its flag refuses.
var invalidValue = regexp.MustCompile(`^invalid (?:boolean )?value ("[^"]*") for flag -([^:]+): (.*)$`)

// nearest returns the candidate closest to s when it is close enough to
// be what was meant (at most a third of its letters edited, or s a prefix
// of it), else "".
func nearest(s string, candidates []string) string {
	sort.Strings(candidates)
	best, bestD := "", len(s)/3+1
	for _, c := range candidates {
		d := editDistance(s, c)
		if strings.HasPrefix(c, s) && len(s) >= 3 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance counts the insertions, deletions, substitutions and swaps
// of neighbouring bytes that turn a into b (optimal string alignment): a
// swap is the commonest slip of typing.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
