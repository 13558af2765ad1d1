package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// The fast ack encoder writes exactly encoding/json's bytes, for acks it handles itself and
// for those it hands back (odd strings, NaN).
func TestFastAckEncodeMatchesJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	strs := []string{"", "ok", "rollout-07", "a\"b", "<x>", "é", "tab\t", "\u2028", "x&y", "\x7f", "\xff"}
	floats := []float64{0, 1, -2.5, 1e-7, 1.5e-6, 9.99e-7, 1e21, 123456789.125, -1e-300, 5e-324, math.MaxFloat64, math.NaN(), math.Inf(1)}
	pick := func() string { return strs[r.IntN(len(strs))] }
	for i := range 20000 {
		a := Ack{V: r.IntN(3), CommandID: pick(), ServerID: pick(), Kind: Kind(pick()), Result: Result(pick()), Code: pick(), Error: pick(),
			WeightVersion: r.Int64N(1 << 40), StagedVersion: r.Int64N(3) - 1, WeightSHA256: pick(), LastTokenBefore: r.Int64N(3),
			FirstTokenAfter: r.Int64(), Duplicate: r.IntN(2) == 0, At: -r.Int64(), Sig: pick()}
		for range r.IntN(3) {
			p := Phase{Name: pick(), OK: r.IntN(2) == 0, Error: pick(), Seconds: floats[r.IntN(len(floats))]}
			if r.IntN(2) == 0 {
				p.Detail = map[string]int64{}
				for range r.IntN(4) {
					p.Detail[pick()] = r.Int64N(100) - 50
				}
			}
			a.Phases = append(a.Phases, p)
		}
		agree(t, i, &a)
	}
}

func agree(t *testing.T, i int, a *Ack) {
	t.Helper()
	want, werr := json.Marshal(a)
	got, ok := appendAck(nil, a)
	if ok && (werr != nil || !bytes.Equal(got, want)) {
		t.Fatalf("case %d: fast encoder wrote\n%s\nencoding/json\n%s (err %v)", i, got, want, werr)
	}
	enc, err := a.Encode()
	if werr == nil && len(want) > MaxMessageBytes {
		// Encode refuses what no receiver would take: a fuzzer's invalid UTF-8 grows six-fold
		// as \ufffd escapes.
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("case %d: Encode of a %d-byte ack: %v, want ErrTooLarge", i, len(want), err)
		}
		return
	}
	if (err == nil) != (werr == nil) || (err == nil && !bytes.Equal(enc, want)) {
		t.Fatalf("case %d: Encode\n%s (err %v)\nencoding/json\n%s (err %v)", i, enc, err, want, werr)
	}
}

func FuzzFastAckEncode(f *testing.F) {
	f.Add("c1", "s1", "resume", "ok", "", "", "resume", 1.5e-6, int64(3), true)
	f.Add("<", "\xff", "", "failed", "x", "é", "", 1e21, int64(-1), false)
	f.Fuzz(func(t *testing.T, cmd, srv, kind, result, code, msg, phase string, secs float64, v int64, dup bool) {
		a := Ack{V: Version, CommandID: cmd, ServerID: srv, Kind: Kind(kind), Result: Result(result), Code: code, Error: msg,
			WeightVersion: v, StagedVersion: -v, Duplicate: dup, At: v * 3, Sig: code,
			Phases: []Phase{{Name: phase, Seconds: secs, Detail: map[string]int64{phase: v, code: -v}}}}
		agree(t, 0, &a)
	})
}
