package protocol

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkServerPath is what signing costs each server per command, and the trainer per
// server: verify a 32-target resume's MAC, sign the ack, verify the ack.
func BenchmarkServerPath(b *testing.B) {
	trainer := newAuth([][]byte{[]byte("0123456789abcdef0123456789abcdef")})
	targets := make([]string, 32)
	for i := range targets {
		targets[i] = fmt.Sprintf("rollout-%02d", i) // sorted, as the SDK sends them
	}
	e, err := NewEnvelope("fleet", targets, &Resume{}, time.UnixMilli(1_700_000_000_000), 30*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	e.Trace = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	e.SignWith(trainer)
	now := time.UnixMilli(1_700_000_000_000)
	b.Run("verify-command", func(b *testing.B) {
		for b.Loop() {
			if err := e.VerifyFor(trainer, "fleet", e.Targets[7], now); err != nil {
				b.Fatal(err)
			}
		}
	})
	ack := Ack{V: Version, CommandID: e.ID, ServerID: e.Targets[7], Kind: KindPause, Result: ResultOK, WeightVersion: 3, At: 7}
	b.Run("sign-ack", func(b *testing.B) {
		for b.Loop() {
			a := ack
			a.SignWith(trainer, "fleet")
		}
	})
	ack.SignWith(trainer, "fleet")
	b.Run("verify-ack", func(b *testing.B) {
		for b.Loop() {
			if err := ack.VerifyWith(trainer, "fleet"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPublishPath is the trainer's share of a command before anything is sent: MAC a
// 32-target resume for every target and encode it.
func BenchmarkPublishPath(b *testing.B) {
	trainer := newAuth([][]byte{[]byte("0123456789abcdef0123456789abcdef")})
	targets := make([]string, 32)
	for i := range targets {
		targets[i] = fmt.Sprintf("rollout-%02d", i)
	}
	for b.Loop() {
		e, err := NewEnvelope("fleet", targets, &Resume{}, time.UnixMilli(1_700_000_000_000), 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		e.Trace = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		e.SignWith(trainer)
		if _, err := e.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}
