package rls

import (
	"errors"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxJSONBytes bounds a /json request body, as DefaultMaxRecvMsgSize
// bounds a gRPC message.
const MaxJSONBytes = DefaultMaxRecvMsgSize

// HTTPHandler serves envoyproxy/ratelimit's HTTP endpoints over r:
//
//   - /json, whatever the method (as the peer's): a RateLimitRequest as
//     JSON (protojson) in the body, answered with the RateLimitResponse as
//     JSON, status 429 when OVER_LIMIT, 200 otherwise. A body that is not
//     such a request, or a request the service refuses, is a 400 text/plain
//     "Bad Request", as the peer answers; a body over MaxJSONBytes is a 413
//     and a store that failed a 503, both text/plain.
//   - GET /healthcheck: "OK" while healthy() (nil: always), else 500.
//   - GET /rlconfig: the configuration in force, one rule a line.
func HTTPHandler(r *Reloader, healthy func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxJSONBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				plainStatus(w, http.StatusRequestEntityTooLarge)
				return
			}
			plainStatus(w, http.StatusBadRequest)
			return
		}
		var rr rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &rr); err != nil {
			plainStatus(w, http.StatusBadRequest)
			return
		}
		resp, err := r.ShouldRateLimit(req.Context(), &rr)
		if err != nil {
			code := http.StatusBadRequest
			if status.Code(err) == codes.Unavailable {
				code = http.StatusServiceUnavailable
			}
			plainStatus(w, code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			plainStatus(w, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if healthy != nil && !healthy() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "OK")
	})
	mux.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, r.Config().Dump())
	})
	return mux
}

// plainStatus answers code with its status text, text/plain, as
// envoyproxy/ratelimit's /json answers what it refuses.
func plainStatus(w http.ResponseWriter, code int) {
	http.Error(w, http.StatusText(code), code)
}
