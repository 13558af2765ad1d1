package protocol

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// stdDecode is the standard strict decoder the fast path must agree with.
func stdDecode(b []byte, v any) error { return strict(b, v) }

func sampleEnvelope(t testing.TB) []byte {
	t.Helper()
	targets := make([]string, 32)
	for i := range targets {
		targets[i] = "server-" + string(rune('a'+i%26)) + string(rune('0'+i/26))
	}
	e, err := NewEnvelope("fleet", targets, &Pause{Mode: "abort", ClearCache: true}, time.UnixMilli(1_700_000_000_000), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e.Trace = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	e.Epoch, e.FleetWide, e.Desired = 7, true, json.RawMessage(`{"v":1,"epoch":7,"sig":"x"}`)
	e.SignWith(newAuth([][]byte{[]byte("0123456789abcdef0123456789abcdef")}))
	b, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sampleAck(t testing.TB) []byte {
	t.Helper()
	a := Ack{V: Version, CommandID: "c1", ServerID: "s1", Kind: KindCommit, Result: ResultOK, WeightVersion: 3, StagedVersion: 4,
		WeightSHA256: "ab", LastTokenBefore: 5, FirstTokenAfter: 6, At: 7, Sig: "hmac:k:00",
		Phases: []Phase{{Name: "pause", OK: true, Seconds: 1.5e-6, Detail: map[string]int64{"jobs": 3, "blocks": -2}}, {Name: "x", Error: "é"}}}
	b, err := a.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The messages the encoders write take the fast path: without this the optimisation could
// silently stop applying and only benchmarks would notice.
func TestEncodedMessagesTakeTheFastPath(t *testing.T) {
	var e Envelope
	if !fastEnvelope(sampleEnvelope(t), &e) {
		t.Fatal("an encoded envelope fell back to the standard decoder")
	}
	var a Ack
	if !fastAck(sampleAck(t), &a) {
		t.Fatal("an encoded ack fell back to the standard decoder")
	}
	if len(e.Targets) != 32 || e.Kind != KindPause || string(e.Desired) == "" || a.Phases[0].Detail["blocks"] != -2 {
		t.Fatalf("decoded wrong: %+v %+v", e, a)
	}
}

func TestFastPathGivesUpOnWhatItDoesNotRead(t *testing.T) {
	for _, in := range []string{
		`{"v":1,"V":1}`, `{"v":1,"v":1}`, `{"ID":"x"}`, `{"id":"a\"b"}`, `{"id":null}`, `{"v":1.0}`, `{"v":1e2}`,
		`{"v":01}`, `{"body":null}`, `{"v":1} x`, `{"v":1,}`, `{"id":"` + "\xff" + `"}`, `{"targets":["a",]}`,
		`{"trace":{"a":"b","a":"c"}}`, `{"body":{"a":}}`, `{"v":99999999999999999999}`, `{"unknown":1}`,
	} {
		var e Envelope
		if fastEnvelope([]byte(in), &e) {
			t.Errorf("fast path accepted %s", in)
		}
	}
}

func fuzzAgree[T any](t *testing.T, b []byte, fast func([]byte, *T) bool) {
	var f T
	if !fast(b, &f) {
		return
	}
	var s T
	if err := stdDecode(b, &s); err != nil {
		t.Fatalf("fast path accepted what the standard decoder refuses (%v): %q", err, b)
	}
	if !reflect.DeepEqual(f, s) {
		t.Fatalf("fast and standard decoders differ on %q:\nfast %#v\nstd  %#v", b, f, s)
	}
}

// FuzzFastDecodeAgrees: wherever the fast path answers, the standard strict decoder accepts
// the same bytes and decodes the same value.
func FuzzFastDecodeAgrees(f *testing.F) {
	f.Add(sampleEnvelope(f))
	f.Add(sampleAck(f))
	for _, s := range []string{
		`{"v":1,"body":{ "a" : [1, "x\"y", {"b":null}] } ,"desired":"s"}`, `{"v":-0,"deadline":-12,"targets":[]}`,
		` {"trace":{}, "body":[] } `, `{"phases":[{"seconds":1.5e-3,"detail":{}}],"duplicate":true}`, `{"body":1}`,
		`{"body":"\u00e9"}`, `{"id":"é"}`, `{"body":tru}`, `{"fleet_wide":false,"epoch":3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzAgree(t, b, fastEnvelope)
		fuzzAgree(t, b, fastAck)
	})
}

func BenchmarkDecodeEnvelope(b *testing.B) {
	raw := sampleEnvelope(b)
	b.Run("fast", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			if _, err := DecodeEnvelope(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("standard", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			var e Envelope
			if err := decode(raw, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodeAck(b *testing.B) {
	raw := sampleAck(b)
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeAck(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("standard", func(b *testing.B) {
		for b.Loop() {
			var a Ack
			if err := decode(raw, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
}
