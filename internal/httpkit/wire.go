package httpkit

// AllowResponse is the JSON answer of the decision API (POST /v1/allow)
// to one decision: every engine.Decision field plus the policy name.
// Durations are given exactly in nanoseconds and, for convenience, in
// whole seconds rounded up (as the headers show them). The server writes
// it and package remote reads it.
type AllowResponse struct {
	Allowed           bool   `json:"allowed"`
	Policy            string `json:"policy"`
	Limit             int    `json:"limit"`
	Remaining         int    `json:"remaining"`
	RetryAfterNs      int64  `json:"retry_after_ns"`
	ResetNs           int64  `json:"reset_ns"`
	At                int64  `json:"at"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
	ResetSeconds      int64  `json:"reset_seconds"`
	// Overflow is true when the key was new and the policy already tracks
	// its max_keys keys: refused (429) with overflow "refuse", admitted
	// untracked with "allow".
	Overflow bool `json:"overflow,omitempty"`
}
