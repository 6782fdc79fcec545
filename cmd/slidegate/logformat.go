package main

import (
	"io"
	"log/slog"
)

// newLogger returns serve's logger: logfmt text (format "text") or one
// JSON object a line ("json", for log collectors), at level.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
