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
	return string(v), ok
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
	start := s.i
	var spans [][2]int
	ok := s.array(func() bool {
		v, ok := s.rawString()
		at := s.i - 1 - len(v) - start
		spans = append(spans, [2]int{at, at + len(v)})
		return ok
	})
	if !ok {
		return nil, false
	}
	backing := string(s.b[start:s.i])
	out := make([]string, len(spans))
	for i, sp := range spans {
		out[i] = backing[sp[0]:sp[1]]
	}
	return out, true
}

func (s *scanner) stringMap() (map[string]string, bool) {
	out := map[string]string{}
	ok := s.object(func(name []byte) bool {
		if _, dup := out[string(name)]; dup {
			return false
		}
		v, ok := s.str()
		out[string(name)] = v
		return ok
	})
	return out, ok
}

func (s *scanner) int64Map() (map[string]int64, bool) {
	out := map[string]int64{}
	ok := s.object(func(name []byte) bool {
		if _, dup := out[string(name)]; dup {
			return false
		}
		v, ok := s.int64()
		out[string(name)] = v
		return ok
	})
	return out, ok
}

// once tracks which fields an object named, so a repeated one gives up.
type once uint32

func (o *once) first(bit uint) bool {
	if *o&(1<<bit) != 0 {
		return false
	}
	*o |= 1 << bit
	return true
}

// fastEnvelope decodes what Envelope.Encode writes; false means "ask the standard decoder".
func fastEnvelope(b []byte, e *Envelope) bool {
	s := scanner{b: b}
	var seen once
	ok := s.object(func(name []byte) bool {
		var ok bool
		switch string(name) {
		case "v":
			if !seen.first(0) {
				return false
			}
			var v int64
			v, ok = s.int64()
			e.V = int(v)
		case "id":
			if !seen.first(1) {
				return false
			}
			e.ID, ok = s.str()
		case "fleet":
			if !seen.first(2) {
				return false
			}
			e.Fleet, ok = s.str()
		case "targets":
			if !seen.first(3) {
				return false
			}
			e.Targets, ok = s.strings()
		case "issued_at":
			if !seen.first(4) {
				return false
			}
			e.IssuedAt, ok = s.int64()
		case "deadline":
			if !seen.first(5) {
				return false
			}
			e.Deadline, ok = s.int64()
		case "trace":
			if !seen.first(6) {
				return false
			}
			e.Trace, ok = s.stringMap()
		case "kind":
			if !seen.first(7) {
				return false
			}
			var k string
			k, ok = s.str()
			e.Kind = Kind(k)
		case "body":
			if !seen.first(8) {
				return false
			}
			e.Body, ok = s.raw()
		case "epoch":
			if !seen.first(9) {
				return false
			}
			e.Epoch, ok = s.int64()
		case "fleet_wide":
			if !seen.first(10) {
				return false
			}
			e.FleetWide, ok = s.boolean()
		case "desired":
			if !seen.first(11) {
				return false
			}
			e.Desired, ok = s.raw()
		case "macs":
			if !seen.first(12) {
				return false
			}
			e.MACs, ok = s.str()
		case "sig":
			if !seen.first(13) {
				return false
			}
			e.Sig, ok = s.str()
		}
		return ok
	})
	return ok && s.atEnd()
}

// fastAck decodes what Ack.Encode writes; false means "ask the standard decoder".
func fastAck(b []byte, a *Ack) bool {
	s := scanner{b: b}
	var seen once
	str := func(bit uint, dst *string) bool {
		if !seen.first(bit) {
			return false
		}
		v, ok := s.str()
		*dst = v
		return ok
	}
	i64 := func(bit uint, dst *int64) bool {
		if !seen.first(bit) {
			return false
		}
		v, ok := s.int64()
		*dst = v
		return ok
	}
	ok := s.object(func(name []byte) bool {
		switch string(name) {
		case "v":
			var v int64
			ok := i64(0, &v)
			a.V = int(v)
			return ok
		case "command_id":
			return str(1, &a.CommandID)
		case "server_id":
			return str(2, &a.ServerID)
		case "kind":
			var k string
			ok := str(3, &k)
			a.Kind = Kind(k)
			return ok
		case "result":
			var r string
			ok := str(4, &r)
			a.Result = Result(r)
			return ok
		case "code":
			return str(5, &a.Code)
		case "error":
			return str(6, &a.Error)
		case "phases":
			if !seen.first(7) {
				return false
			}
			a.Phases = []Phase{}
			return s.array(func() bool {
				var p Phase
				ok := fastPhase(&s, &p)
				a.Phases = append(a.Phases, p)
				return ok
			})
		case "weight_version":
			return i64(8, &a.WeightVersion)
		case "staged_version":
			return i64(9, &a.StagedVersion)
		case "weight_sha256":
			return str(10, &a.WeightSHA256)
		case "last_token_before":
			return i64(11, &a.LastTokenBefore)
		case "first_token_after":
			return i64(12, &a.FirstTokenAfter)
		case "duplicate":
			if !seen.first(13) {
				return false
			}
			var ok bool
			a.Duplicate, ok = s.boolean()
			return ok
		case "at":
			return i64(14, &a.At)
		case "sig":
			return str(15, &a.Sig)
		}
		return false
	})
	return ok && s.atEnd()
}

func fastPhase(s *scanner, p *Phase) bool {
	var seen once
	return s.object(func(name []byte) bool {
		var ok bool
		switch string(name) {
		case "name":
			if !seen.first(0) {
				return false
			}
			p.Name, ok = s.str()
		case "ok":
			if !seen.first(1) {
				return false
			}
			p.OK, ok = s.boolean()
		case "error":
			if !seen.first(2) {
				return false
			}
			p.Error, ok = s.str()
		case "seconds":
			if !seen.first(3) {
				return false
			}
			p.Seconds, ok = s.float64()
		case "detail":
			if !seen.first(4) {
				return false
			}
			p.Detail, ok = s.int64Map()
		}
		return ok
	})
}
