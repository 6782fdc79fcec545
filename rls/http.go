package rls

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxJSONBytes bounds a /json request body, as DefaultMaxRecvMsgSize
// bounds a gRPC message.
const MaxJSONBytes = DefaultMaxRecvMsgSize

// HTTPHandler serves envoyproxy/ratelimit's HTTP endpoints over r:
//
//   - POST /json: a RateLimitRequest as JSON (protojson), answered with
//     the RateLimitResponse as JSON, status 429 when OVER_LIMIT, 200
//     otherwise; a body that is not such a request is a 400
//     application/problem+json.
//   - GET /healthcheck: "OK" while healthy() (nil: always), else 500.
//   - GET /rlconfig: the configuration in force, one rule a line.
func HTTPHandler(r *Reloader, healthy func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			problem(w, http.StatusMethodNotAllowed, "POST a RateLimitRequest as JSON")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxJSONBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				problem(w, http.StatusRequestEntityTooLarge, "the body is larger than 2 MiB")
				return
			}
			problem(w, http.StatusBadRequest, "the body could not be read")
			return
		}
		var rr rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &rr); err != nil {
			problem(w, http.StatusBadRequest, "the body is not a RateLimitRequest in JSON")
			return
		}
		resp, err := r.ShouldRateLimit(req.Context(), &rr)
		if err != nil {
			code := http.StatusBadRequest
			if status.Code(err).String() == "Unavailable" {
				code = http.StatusServiceUnavailable
			}
			problem(w, code, status.Convert(err).Message())
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			problem(w, http.StatusInternalServerError, "the response could not be encoded")
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

// problem writes an RFC 9457 problem.
func problem(w http.ResponseWriter, code int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"title": http.StatusText(code), "status": code, "detail": detail})
}
