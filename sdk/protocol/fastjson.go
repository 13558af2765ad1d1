package protocol

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// A fast path for the two messages every control round trip decodes once per server: the
// command envelope (on every server) and the ack (on the client, once per server). The
// standard decoder spends ~13 µs on a 1 KB envelope, reflection and a second scan included,
// which at 32 servers was the largest cost of a round trip after Redis itself.
//
// The fast path reads only the shape the encoder writes: exact field names, each at most
// once, strings without escapes, integers without fraction or exponent, no nulls. Anything
// else (escapes, case-folded or unknown names, duplicates, nulls, odd numbers, bad JSON) makes
// it give up, and the standard strict decoder decides, so what it accepts and rejects is the
// standard decoder's by construction; a differential fuzz test holds the fast path to equal
// results wherever it answers.

// scanner walks one JSON text.
type scanner struct {
	b []byte
	i int
	// text is b as a string, made on the first string read: every string decoded is a
	// substring of it, one allocation per message instead of one per field and target.
	text string
}

// substr returns b[i:j] as a substring of text.
func (s *scanner) substr(i, j int) string {
	if s.text == "" {
		s.text = string(s.b)
	}
	return s.text[i:j]
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte (0 at the end).
func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

// eat consumes c after spaces.
func (s *scanner) eat(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// atEnd reports whether only spaces remain.
func (s *scanner) atEnd() bool { return s.peek() == 0 && s.i == len(s.b) }

// rawString returns the bytes of a string with no escapes and no control characters, valid
// UTF-8 (the standard decoder replaces invalid bytes: give up rather than differ).
func (s *scanner) rawString() ([]byte, bool) {
	if !s.eat('"') {
		return nil, false
	}
	start, ascii := s.i, true
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			if !ascii && !utf8.Valid(v) {
				return nil, false
			}
			return v, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
		s.i++
	}
	return nil, false
}

func (s *scanner) str() (string, bool) {
	v, ok := s.rawString()
	if !ok || len(v) == 0 {
		return "", ok
	}
	end := s.i - 1 // the closing quote
	return s.substr(end-len(v), end), true
}

// number returns the bytes of a JSON number and whether it is an integer.
func (s *scanner) number() (num []byte, integer, ok bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	intStart := s.i
	n := digits()
	if n == 0 || (n > 1 && s.b[intStart] == '0') {
		return nil, false, false
	}
	integer = true
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return nil, false, false
		}
		integer = false
	}
	return s.b[start:s.i], integer, true
}

func (s *scanner) int64() (int64, bool) {
	num, integer, ok := s.number()
	if !ok || !integer {
		return 0, false
	}
	v, err := strconv.ParseInt(string(num), 10, 64)
	return v, err == nil
}

func (s *scanner) float64() (float64, bool) {
	num, _, ok := s.number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(num), 64)
	return v, err == nil
}

func (s *scanner) boolean() (bool, bool) {
	s.ws()
	switch {
	case len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "true":
		s.i += 4
		return true, true
	case len(s.b)-s.i >= 5 && string(s.b[s.i:s.i+5]) == "false":
		s.i += 5
		return false, true
	}
	return false, false
}

// raw returns a copy of the next value's bytes, which must be valid JSON and not null (a
// null RawMessage field decodes as the bytes "null" in the standard decoder, left to it).
func (s *scanner) raw() (json.RawMessage, bool) {
	s.ws()
	start := s.i
	if !s.skip() {
		return nil, false
	}
	v := s.b[start:s.i]
	if string(v) == "null" || !json.Valid(v) {
		return nil, false
	}
	return append(json.RawMessage(nil), v...), true
}

// skip moves past one value, finding only where it ends: json.Valid judges it.
func (s *scanner) skip() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		for s.i++; s.i < len(s.b); s.i++ {
			switch s.b[s.i] {
			case '\\':
				s.i++
			case '"':
				s.i++
				return true
			}
		}
		return false
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				if !s.skip() {
					return false
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					s.i++
					return true
				}
			}
			s.i++
		}
		return false
	}
	for ; s.i < len(s.b); s.i++ { // a literal or a number runs to a delimiter
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return true
		}
	}
	return true
}

// object calls field for each member of an object; field consumes the value and returns false
// to give up (an unknown or repeated name, a value of the wrong shape).
func (s *scanner) object(field func(name []byte) bool) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	for {
		name, ok := s.rawString()
		if !ok || !s.eat(':') || !field(name) {
			return false
		}
		if s.eat('}') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// array calls elem for each element of an array; an empty array calls it never.
func (s *scanner) array(elem func() bool) bool {
	if !s.eat('[') {
		return false
	}
	if s.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.eat(']') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// strings reads an array of strings into substrings of one copy of the array's bytes: a
// command names up to 256 targets, and one allocation beats one per name.
func (s *scanner) strings() ([]string, bool) {
	s.ws()
	spans := make([][2]int, 0, 64) // on the stack for up to 64 strings
	ok := s.array(func() bool {
		v, ok := s.rawString()
		at := s.i - 1 - len(v)
		spans = append(spans, [2]int{at, at + len(v)})
		return ok
	})
	if !ok {
		return nil, false
	}
	out := make([]string, len(spans))
	for i, sp := range spans {
		out[i] = s.substr(sp[0], sp[1])
	}
	return out, true
}

// objectOf reads an object whose values read reads, each name at most once.
func objectOf[T any](s *scanner, read func() (T, bool)) (map[string]T, bool) {
	out := map[string]T{}
	ok := s.object(func(name []byte) bool {
		if _, dup := out[string(name)]; dup {
			return false
		}
		v, ok := read()
		out[string(name)] = v
		return ok
	})
	return out, ok
}

// fields reads an object's members into a struct, each name at most once.
type fields struct{ seen uint32 }

// first marks member bit as read, false when it was read before.
func (f *fields) first(bit uint) bool {
	if f.seen&(1<<bit) != 0 {
		return false
	}
	f.seen |= 1 << bit
	return true
}

// take reads member bit into dst with read, refusing a second reading of it.
func take[T any](f *fields, bit uint, dst *T, read func() (T, bool)) bool {
	if !f.first(bit) {
		return false
	}
	v, ok := read()
	*dst = v
	return ok
}

// integer reads a JSON integer into an int (the version fields).
func (s *scanner) integer() (int, bool) {
	v, ok := s.int64()
	return int(v), ok
}

func (s *scanner) kind() (Kind, bool) {
	v, ok := s.str()
	return Kind(v), ok
}

func (s *scanner) result() (Result, bool) {
	v, ok := s.str()
	return Result(v), ok
}

func (s *scanner) stringMap() (map[string]string, bool) { return objectOf(s, s.str) }

// fastEnvelope decodes what Envelope.Encode writes; false means "ask the standard decoder".
func fastEnvelope(b []byte, e *Envelope) bool {
	s := scanner{b: b}
	var f fields
	ok := s.object(func(name []byte) bool {
		switch string(name) {
		case "v":
			return take(&f, 0, &e.V, s.integer)
		case "id":
			return take(&f, 1, &e.ID, s.str)
		case "fleet":
			return take(&f, 2, &e.Fleet, s.str)
		case "targets":
			return take(&f, 3, &e.Targets, s.strings)
		case "issued_at":
			return take(&f, 4, &e.IssuedAt, s.int64)
		case "deadline":
			return take(&f, 5, &e.Deadline, s.int64)
		case "trace":
			return take(&f, 6, &e.Trace, s.stringMap)
		case "kind":
			return take(&f, 7, &e.Kind, s.kind)
		case "body":
			return take(&f, 8, &e.Body, s.raw)
		case "epoch":
			return take(&f, 9, &e.Epoch, s.int64)
		case "fleet_wide":
			return take(&f, 10, &e.FleetWide, s.boolean)
		case "desired":
			return take(&f, 11, &e.Desired, s.raw)
		case "macs":
			return take(&f, 12, &e.MACs, s.str)
		case "sig":
			return take(&f, 13, &e.Sig, s.str)
		}
		return false
	})
	return ok && s.atEnd()
}

// fastAck decodes what Ack.Encode writes; false means "ask the standard decoder".
func fastAck(b []byte, a *Ack) bool {
	s := scanner{b: b}
	var f fields
	ok := s.object(func(name []byte) bool {
		switch string(name) {
		case "v":
			return take(&f, 0, &a.V, s.integer)
		case "command_id":
			return take(&f, 1, &a.CommandID, s.str)
		case "server_id":
			return take(&f, 2, &a.ServerID, s.str)
		case "kind":
			return take(&f, 3, &a.Kind, s.kind)
		case "result":
			return take(&f, 4, &a.Result, s.result)
		case "code":
			return take(&f, 5, &a.Code, s.str)
		case "error":
			return take(&f, 6, &a.Error, s.str)
		case "phases":
			return take(&f, 7, &a.Phases, s.phases)
		case "weight_version":
			return take(&f, 8, &a.WeightVersion, s.int64)
		case "staged_version":
			return take(&f, 9, &a.StagedVersion, s.int64)
		case "weight_sha256":
			return take(&f, 10, &a.WeightSHA256, s.str)
		case "last_token_before":
			return take(&f, 11, &a.LastTokenBefore, s.int64)
		case "first_token_after":
			return take(&f, 12, &a.FirstTokenAfter, s.int64)
		case "duplicate":
			return take(&f, 13, &a.Duplicate, s.boolean)
		case "at":
			return take(&f, 14, &a.At, s.int64)
		case "sig":
			return take(&f, 15, &a.Sig, s.str)
		}
		return false
	})
	return ok && s.atEnd()
}

func (s *scanner) phases() ([]Phase, bool) {
	out := []Phase{}
	ok := s.array(func() bool {
		var p Phase
		ok := s.phase(&p)
		out = append(out, p)
		return ok
	})
	return out, ok
}

func (s *scanner) phase(p *Phase) bool {
	var f fields
	return s.object(func(name []byte) bool {
		switch string(name) {
		case "name":
			return take(&f, 0, &p.Name, s.str)
		case "ok":
			return take(&f, 1, &p.OK, s.boolean)
		case "error":
			return take(&f, 2, &p.Error, s.str)
		case "seconds":
			return take(&f, 3, &p.Seconds, s.float64)
		case "detail":
			return take(&f, 4, &p.Detail, func() (map[string]int64, bool) { return objectOf(s, s.int64) })
		}
		return false
	})
}
