package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/slidegate/slidegate/internal/server/config"
)

// errNotUTF8 explains why a body with invalid UTF-8 is refused.
var errNotUTF8 = errors.New("the body is not valid UTF-8: keys are compared byte for byte, and invalid bytes would make different keys equal")

// decodeAllow decodes one allow request strictly: field names exactly as
// documented (no case folding), no unknown fields, no trailing data, and
// errors that name the field at fault.
func decodeAllow(data []byte, req *AllowRequest) error {
	if !utf8.Valid(data) {
		return errNotUTF8
	}
	var raw json.RawMessage
	if err := decodeOne(data, &raw); err != nil {
		return err
	}
	return decodeItem(raw, req)
}

// decodeBatch decodes a batch strictly, as decodeAllow does each item.
func decodeBatch(data []byte) ([]AllowRequest, error) {
	if !utf8.Valid(data) {
		return nil, errNotUTF8
	}
	var raws []json.RawMessage
	if err := decodeOne(data, &raws); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, errors.New(`malformed JSON: want an array of {"key", "policy", "cost"} objects`)
		}
		return nil, err
	}
	reqs := make([]AllowRequest, len(raws))
	for i, raw := range raws {
		if err := decodeItem(raw, &reqs[i]); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
	}
	return reqs, nil
}

// decodeOne decodes the single JSON value of data into v.
func decodeOne(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("malformed JSON: empty body")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return err
		}
		return fmt.Errorf("malformed JSON: %v", err) // a SyntaxError or io.ErrUnexpectedEOF: no "json: " prefix
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: data after the value")
	}
	return nil
}

// field is one member of a JSON object.
type field struct {
	name string
	v    json.RawMessage
}

// objectFields returns the members of the JSON value raw, which must be an
// object, in the order they first appear, each with its last value (as
// encoding/json decodes a repeated member into a map); ok is false when
// raw is not an object. The order makes the first error the decoders
// report the same every time: a map's order is random.
func objectFields(raw []byte) (fields []field, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	seen := map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		name, ok := tok.(string)
		if !ok {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		if i, dup := seen[name]; dup {
			fields[i].v = v
			continue
		}
		seen[name] = len(fields)
		fields = append(fields, field{name, v})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	return fields, true
}

// decodeItem decodes one {"key", "policy", "cost"} object; a repeated
// field takes its last value, as in the fast path. Fields are checked in
// the order they first appear.
func decodeItem(raw json.RawMessage, req *AllowRequest) error {
	fields, ok := objectFields(raw)
	if !ok {
		return errors.New(`malformed JSON: want an object {"key", "policy", "cost"}`)
	}
	for _, f := range fields {
		name, v := f.name, f.v
		switch name {
		case "key":
			if err := json.Unmarshal(v, &req.Key); err != nil {
				return errors.New(`malformed JSON: "key" must be a string`)
			}
		case "policy":
			if err := json.Unmarshal(v, &req.Policy); err != nil {
				return errors.New(`malformed JSON: "policy" must be a string`)
			}
		case "limits":
			ls, err := decodeLimits(v)
			if err != nil {
				return err
			}
			req.Limits = ls
		case "tag":
			if err := json.Unmarshal(v, &req.Tag); err != nil {
				return errors.New(`malformed JSON: "tag" must be a string`)
			}
		case "cost":
			if string(v) == "null" {
				req.Cost = nil
				continue
			}
			var n int
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf(`malformed JSON: "cost" must be a whole number, not %.20s`, v)
			}
			req.Cost = &n
		default:
			return fmt.Errorf(`malformed JSON: unknown field %q (the fields are "key", "policy", "cost", "limits" and "tag", in lower case)`, name)
		}
	}
	return nil
}

// decodeLimits decodes a "limits" array of {"policy", "key"} objects,
// at most MaxLimits of them.
func decodeLimits(v json.RawMessage) ([]LimitRequest, error) {
	const want = `malformed JSON: "limits" must be an array of {"policy", "key"} objects`
	var raws []json.RawMessage
	if err := json.Unmarshal(v, &raws); err != nil || raws == nil {
		return nil, errors.New(want)
	}
	if len(raws) > config.MaxLimits {
		return nil, fmt.Errorf(`"limits" holds %d limits; at most %d are allowed`, len(raws), config.MaxLimits)
	}
	out := make([]LimitRequest, len(raws))
	for i, raw := range raws {
		fields, ok := objectFields(raw)
		if !ok {
			return nil, errors.New(want)
		}
		for _, f := range fields {
			name, fv := f.name, f.v
			var dst *string
			switch name {
			case "policy":
				dst = &out[i].Policy
			case "key":
				dst = &out[i].Key
			default:
				return nil, fmt.Errorf(`malformed JSON: limits[%d]: unknown field %q (the fields are "policy" and "key")`, i, name)
			}
			if err := json.Unmarshal(fv, dst); err != nil {
				return nil, fmt.Errorf(`malformed JSON: limits[%d]: %q must be a string`, i, name)
			}
		}
	}
	return out, nil
}
