package protocol_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

func envelopeSeeds(f *testing.F) {
	for _, cmd := range commands() {
		e, err := protocol.NewEnvelope("f", []string{"b", "a"}, cmd, t0, time.Second)
		if err != nil {
			f.Fatal(err)
		}
		e.Trace = map[string]string{"traceparent": "00-x-y-01"}
		e.Sign(secret)
		b, err := e.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"id":"x","fleet":"f","issued_at":0,"deadline":0,"kind":"pause","body":{ "mode" : "abort" }}`))
	f.Add([]byte(`{"v":1,"body":"\u003c"}`))
	f.Add([]byte(`{"v":1,"kind":"wake","body":[1,2,{"a":null}],"trace":{"k":"\ud800"}}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"v":1}{}`))
}

// FuzzDecodeEnvelope: decoding never panics; whatever decodes re-encodes, decodes again to
// the same envelope with the same canonical bytes (so a signature survives a re-encoding), and
// verifying and reading its command return errors, not panics.
func FuzzDecodeEnvelope(f *testing.F) {
	envelopeSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := protocol.DecodeEnvelope(b)
		if err != nil {
			if e != nil {
				t.Fatal("an error and an envelope")
			}
			return
		}
		_ = e.Verify(secret, "f", t0)
		_ = e.Verify(nil, "f", t0)
		_, _ = e.Command()
		_ = e.ForServer("a")
		b1, err := e.Encode()
		if errors.Is(err, protocol.ErrTooLarge) {
			return // re-escaping (<, >, & as \u003c...) can grow a message past the limit
		}
		if err != nil {
			t.Fatalf("decoded envelope does not encode: %v", err)
		}
		e2, err := protocol.DecodeEnvelope(b1)
		if err != nil {
			t.Fatalf("re-encoded envelope does not decode: %v\n%s", err, b1)
		}
		if !bytes.Equal(e.Canonical(), e2.Canonical()) {
			t.Fatalf("canonical bytes changed by re-encoding:\n%q\n%q", e.Canonical(), e2.Canonical())
		}
		b2, err := e2.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encoding not stable:\n%s\n%s", b1, b2)
		}
		// Signing what was decoded and verifying it works for every decodable envelope.
		e2.Sign(secret)
		if err := e2.Verify(secret, e2.Fleet, time.UnixMilli(e2.Deadline)); err != nil &&
			!errors.Is(err, protocol.ErrMalformed) && !errors.Is(err, protocol.ErrVersion) {
			t.Fatalf("freshly signed envelope fails: %v", err)
		}
	})
}

// FuzzDecodeHeartbeat: the same for heartbeats.
func FuzzDecodeHeartbeat(f *testing.F) {
	h := heartbeat()
	h.Sign(secret)
	b, err := h.Encode()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"v":1,"server_id":"s","kv_usage":1e-320,"running":-1}`))
	f.Add([]byte(`{"v":1,"server_id":"\u0000","kv_usage":-0}`))
	f.Add([]byte(`{"v":1,"server_id":"s","kv_usage":1e400}`))
	f.Add([]byte(`{"v":1,"server_id":"s","error":"\xff"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := protocol.DecodeHeartbeat(b)
		if err != nil {
			if h != nil {
				t.Fatal("an error and a heartbeat")
			}
			return
		}
		_ = h.Verify(secret, "f")
		b1, err := h.Encode()
		if errors.Is(err, protocol.ErrTooLarge) {
			return
		}
		if err != nil {
			t.Fatalf("decoded heartbeat does not encode: %v", err)
		}
		h2, err := protocol.DecodeHeartbeat(b1)
		if err != nil {
			t.Fatalf("re-encoded heartbeat does not decode: %v\n%s", err, b1)
		}
		if !bytes.Equal(h.Canonical(), h2.Canonical()) {
			t.Fatalf("canonical bytes changed by re-encoding:\n%q\n%q", h.Canonical(), h2.Canonical())
		}
		b2, err := h2.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encoding not stable:\n%s\n%s", b1, b2)
		}
		h2.Sign(secret)
		if err := h2.Verify(secret, h2.Fleet); err != nil {
			t.Fatalf("freshly signed heartbeat fails: %v", err)
		}
	})
}
