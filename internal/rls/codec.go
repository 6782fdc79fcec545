package rls

import (
	"bytes"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// lenientCodec is the protobuf codec that decodes strings that are not
// UTF-8, and counts the messages it cannot decode.
//
// Envoy copies header bytes into descriptor values, and HTTP allows bytes
// that are not UTF-8 (obs-text, such as Latin-1 "caf\xe9"). protobuf-go
// refuses such a proto3 string, so gRPC would answer the call Internal
// (a free pass behind Envoy). When a message does not decode, its strings
// are rewritten with ValidString and it is decoded again: the request is
// decided, and distinct byte strings stay distinct keys.
type lenientCodec struct {
	encoding.CodecV2
	malformed func()
}

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil && !mayEscape(data) {
		return nil
	}
	if m, ok := v.(proto.Message); ok {
		buf := data.Materialize()
		if fixed, ok := validStrings(buf, m.ProtoReflect().Descriptor(), 0); ok {
			proto.Reset(m)
			if proto.Unmarshal(fixed, m) == nil {
				return nil
			}
		}
	}
	if err == nil {
		return nil
	}
	c.malformed()
	return err
}

// mayEscape reports whether data may hold a rune ValidString escapes:
// their UTF-8 starts with 0xF4, which is rare in a request.
func mayEscape(data mem.BufferSlice) bool {
	for _, b := range data {
		if bytes.IndexByte(b.ReadOnlyData(), 0xF4) >= 0 {
			return true
		}
	}
	return false
}

// needsEscape reports whether ValidString changes s.
func needsEscape(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for i := strings.IndexByte(s, 0xF4); i >= 0; {
		if r, _ := utf8.DecodeRuneInString(s[i:]); r >= escByte && r <= escRune {
			return true
		}
		j := strings.IndexByte(s[i+1:], 0xF4)
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// maxNesting bounds the message nesting validStrings follows, as
// protobuf-go bounds its own recursion.
const maxNesting = 100

// validStrings returns b, a message of type md in the wire format, with
// every string field that is not UTF-8 replaced by ValidString of it, and
// false when b is not a well-formed message.
func validStrings(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool) {
	if depth > maxNesting {
		return nil, false
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		tag := b[:n]
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil || (fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.MessageKind) {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return nil, false
			}
			out = append(out, tag...)
			out = append(out, b[:m]...)
			b = b[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return nil, false
		}
		b = b[m:]
		if fd.Kind() == protoreflect.MessageKind {
			var ok bool
			if v, ok = validStrings(v, fd.Message(), depth+1); !ok {
				return nil, false
			}
		} else if needsEscape(string(v)) {
			v = []byte(ValidString(string(v)))
		}
		out = append(out, tag...)
		out = protowire.AppendBytes(out, v)
	}
	return out, true
}

// Runes ValidString writes: a byte that is not part of UTF-8 becomes
// escByte+b, and a rune of the request in [escByte, escRune] is written
// as escRune followed by escByte+(r-escByte). Both lie in Unicode's
// supplementary private use area B, which no standard assigns.
const (
	escByte = 0x10FE00
	escRune = escByte + 0x100
)

// ValidString returns a UTF-8 string that encodes s one to one: two
// different inputs never give one output. s comes back unchanged when it
// is UTF-8 and holds no rune in [escByte, escRune]. The service decides
// descriptor values sent as bytes that are not UTF-8 (Latin-1 from a
// header, say) under this form.
func ValidString(s string) string {
	if !needsEscape(s) {
		return s
	}
	out := make([]byte, 0, len(s)+8)
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n <= 1:
			out = utf8.AppendRune(out, rune(escByte+int(s[0])))
		case r >= escByte && r <= escRune:
			out = utf8.AppendRune(out, escRune)
			out = utf8.AppendRune(out, r)
		default:
			out = append(out, s[:n]...)
		}
		s = s[n:]
	}
	return string(out)
}
