package protocol

import (
	"math"
	"slices"
	"strconv"
)

// Every server encodes an ack per command and a trainer's fleet call waits for all of them,
// so the ack's encoder writes the bytes itself. It writes exactly what encoding/json writes
// (TestFastAckEncodeMatchesJSON, FuzzFastAckEncode) and hands anything it does not handle
// simply (a string json would escape) back to encoding/json.

// appendAck appends a's JSON to b; false means "use encoding/json".
func appendAck(b []byte, a *Ack) ([]byte, bool) {
	ok := true
	str := func(name, v string, omitEmpty bool) {
		if omitEmpty && v == "" {
			return
		}
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		var good bool
		b, good = appendPlainString(b, v)
		ok = ok && good
	}
	num := func(name string, v int64, omitEmpty bool) {
		if omitEmpty && v == 0 {
			return
		}
		b = append(b, ',', '"')
		b = append(b, name...)
		b = append(b, '"', ':')
		b = strconv.AppendInt(b, v, 10)
	}
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(a.V), 10)
	str("command_id", a.CommandID, false)
	str("server_id", a.ServerID, false)
	str("kind", string(a.Kind), false)
	str("result", string(a.Result), false)
	str("code", a.Code, true)
	str("error", a.Error, true)
	if len(a.Phases) > 0 {
		b = append(b, `,"phases":[`...)
		for i := range a.Phases {
			if i > 0 {
				b = append(b, ',')
			}
			var good bool
			if b, good = appendPhase(b, &a.Phases[i]); !good {
				return b, false
			}
		}
		b = append(b, ']')
	}
	num("weight_version", a.WeightVersion, false)
	num("staged_version", a.StagedVersion, true)
	str("weight_sha256", a.WeightSHA256, true)
	num("last_token_before", a.LastTokenBefore, true)
	num("first_token_after", a.FirstTokenAfter, true)
	if a.Duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	num("at", a.At, false)
	str("sig", a.Sig, true)
	return append(b, '}'), ok
}

func appendPhase(b []byte, p *Phase) ([]byte, bool) {
	b = append(b, `{"name":`...)
	b, ok := appendPlainString(b, p.Name)
	if !ok {
		return b, false
	}
	b = append(b, `,"ok":`...)
	b = strconv.AppendBool(b, p.OK)
	if p.Error != "" {
		b = append(b, `,"error":`...)
		if b, ok = appendPlainString(b, p.Error); !ok {
			return b, false
		}
	}
	b = append(b, `,"seconds":`...)
	if b, ok = appendJSONFloat(b, p.Seconds); !ok {
		return b, false
	}
	if len(p.Detail) > 0 {
		keys := make([]string, 0, len(p.Detail))
		for k := range p.Detail {
			keys = append(keys, k)
		}
		slices.Sort(keys) // encoding/json sorts map keys
		b = append(b, `,"detail":{`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendPlainString(b, k); !ok {
				return b, false
			}
			b = append(b, ':')
			b = strconv.AppendInt(b, p.Detail[k], 10)
		}
		b = append(b, '}')
	}
	return append(b, '}'), true
}

// appendPlainString appends s quoted when encoding/json would write it unescaped: printable
// ASCII without '"', '\\' and the HTML characters json escapes.
func appendPlainString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}

// appendJSONFloat appends f as encoding/json writes a float64 (false for NaN and Inf, which
// it refuses).
func appendJSONFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	start := len(b)
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// encoding/json writes e-07 as e-7.
		if n := len(b) - start; n >= 4 && b[len(b)-4] == 'e' && b[len(b)-3] == '-' && b[len(b)-2] == '0' {
			b[len(b)-2] = b[len(b)-1]
			b = b[:len(b)-1]
		}
	}
	return b, true
}
