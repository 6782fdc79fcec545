// Command slidegate is the one slidegate binary: the rate-limiting server
// (slidegate serve), the Envoy rate limit service (slidegate envoy) and their
// helpers. Run "slidegate help" for the list.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
)

// Build information, stamped by make build through -ldflags -X
// main.version=... -X main.commit=... -X main.date=...
var (
	version = "dev"
	commit  = ""
	date    = ""
)

// command is one subcommand. Files of this package add theirs with
// register from an init function, so that subcommands owned by different
// files (serve, envoy) do not edit one table.
type command struct {
	name    string
	summary string             // one line for slidegate help
	run     func([]string) int // args after the command name; returns the exit code
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("slidegate: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func init() {
	register(command{name: "version", summary: "print version, commit, build date and Go version", run: runVersion})
	register(command{name: "help", summary: "show this help, or a command's: slidegate help serve", run: runHelp})
}

func main() { os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr)) }

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "-v", "-version", "--version":
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		unknownCommand(name, stderr)
		return 2
	}
	return c.run(args[1:])
}

func usage(w io.Writer) {
	fmt.Fprint(w, `slidegate: an exact sliding window rate limiter.

Usage:
  slidegate <command> [flags]

Commands:
`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
Start here:
  slidegate serve                       run the decision API with the built-in policies
  curl -si --json '{"key":"alice"}' 127.0.0.1:8080/v1/allow
  slidegate serve --print-config        the built-in configuration, to copy and edit
  slidegate help serve                  every flag of serve

Documentation: docs/http.md (API, headers, middleware), docs/operations.md
(configuration, metrics, shutdown).
`)
}

func runHelp(args []string) int {
	if len(args) == 0 {
		usage(os.Stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		unknownCommand(args[0], os.Stderr)
		return 2
	}
	return c.run([]string{"-h"})
}

// unknownCommand reports a command that is not one, with the nearest
// command when one is close, and points at the list.
func unknownCommand(name string, w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	msg := fmt.Sprintf("slidegate: unknown command %q", name)
	if s := nearest(name, names); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	fmt.Fprintf(w, "%s\nRun 'slidegate help' for the commands.\n", msg)
}

// buildInfo returns version, commit and date, falling back to what the Go
// toolchain recorded when the binary was not built by make build.
func buildInfo() (v, c, d string) {
	v, c, d = version, commit, date
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && c == "":
				c = s.Value
			case s.Key == "vcs.time" && d == "":
				d = s.Value
			}
		}
	}
	return v, c, d
}

func runVersion(args []string) int {
	if len(args) > 0 {
		fmt.Fprintln(os.Stderr, "usage: slidegate version")
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			return 0
		}
		return 2
	}
	v, c, d := buildInfo()
	line := "slidegate " + v
	if c != "" {
		line += " commit " + c
	}
	if d != "" {
		line += " built " + d
	}
	fmt.Println(strings.TrimSpace(line + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH))
	return 0
}
