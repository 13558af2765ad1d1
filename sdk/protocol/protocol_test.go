package protocol_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

var (
	secret = []byte("0123456789abcdef0123456789abcdef")
	other  = []byte("fedcba9876543210fedcba9876543210")
	t0     = time.UnixMilli(1_764_000_000_000)
	digest = strings.Repeat("ab", 32)
)

// sentinels are the errors a Verify or Decode error must wrap exactly one of.
var sentinels = []error{
	protocol.ErrMalformed, protocol.ErrTooLarge, protocol.ErrVersion, protocol.ErrUnsigned,
	protocol.ErrBadSignature, protocol.ErrExpired, protocol.ErrWrongFleet, protocol.ErrShortSecret,
	protocol.ErrInvalid,
}

func requireOnly(t *testing.T, err, want error) {
	t.Helper()
	require.ErrorIs(t, err, want)
	for _, s := range sentinels {
		if !errors.Is(s, want) { // sentinels are distinct (TestErrorsAreDistinct)
			require.NotErrorIs(t, err, s, "%v wraps %v besides %v", err, s, want)
		}
	}
}

// commands holds one valid value of every command kind.
func commands() map[protocol.Kind]any {
	return map[protocol.Kind]any{
		protocol.KindPause:  protocol.Pause{Mode: protocol.ModeKeep, ClearCache: true},
		protocol.KindResume: protocol.Resume{},
		protocol.KindSleep:  protocol.Sleep{Level: 2, Mode: protocol.ModeAbort},
		protocol.KindWake:   protocol.Wake{Tags: []string{protocol.TagWeights, protocol.TagKVCache}},
		protocol.KindReset:  protocol.Reset{ResetExternal: true, ResetRunning: true},
		protocol.KindStage:  protocol.Stage{Weights: protocol.WeightsRef{Version: 7, URI: "http://w/v7", SHA256: digest}},
		protocol.KindCommit: protocol.Commit{Version: 7, Mode: protocol.ModeWait, ClearCache: true, SleepLevel: 1, SHA256: digest},
		protocol.KindAbort:  protocol.Abort{RequestIDs: []string{"r1", "r2"}},
	}
}

func envelope(t *testing.T, cmd any) *protocol.Envelope {
	t.Helper()
	e, err := protocol.NewEnvelope("f", []string{"s2", "s1"}, cmd, t0, 5*time.Second)
	require.NoError(t, err)
	e.Trace = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	e.Epoch = 3
	return e
}

func TestEnvelopeRoundTrip(t *testing.T) {
	require.Len(t, commands(), len(protocol.Kinds()), "a command for every kind")
	for kind, cmd := range commands() {
		t.Run(string(kind), func(t *testing.T) {
			e := envelope(t, cmd)
			require.Equal(t, kind, e.Kind)
			require.Equal(t, protocol.Version, e.V)
			require.Len(t, e.ID, 32)
			require.Equal(t, t0.UnixMilli(), e.IssuedAt)
			require.Equal(t, t0.Add(5*time.Second).UnixMilli(), e.Deadline)
			e.Sign(secret)
			b, err := e.Encode()
			require.NoError(t, err)
			got, err := protocol.DecodeEnvelope(b)
			require.NoError(t, err)
			require.Equal(t, e, got)
			require.NoError(t, got.Verify(secret, "f", t0))
			back, err := got.Command()
			require.NoError(t, err)
			require.Equal(t, cmd, back)

			// A pointer to a command builds the same envelope.
			p := reflect.New(reflect.TypeOf(cmd))
			p.Elem().Set(reflect.ValueOf(cmd))
			pe, err := protocol.NewEnvelope("f", nil, p.Interface(), t0, time.Second)
			require.NoError(t, err)
			require.Equal(t, kind, pe.Kind)
			require.JSONEq(t, string(e.Body), string(pe.Body))
		})
	}
}

func TestNewEnvelopeRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		fleet   string
		cmd     any
		timeout time.Duration
	}{
		"not a command":   {"f", "pause", time.Second},
		"nil command":     {"f", nil, time.Second},
		"invalid command": {"f", protocol.Pause{Mode: "sometimes"}, time.Second},
		"empty fleet":     {"", protocol.Resume{}, time.Second},
		"zero timeout":    {"f", protocol.Resume{}, 0},
		"negative":        {"f", protocol.Resume{}, -time.Second},
	} {
		_, err := protocol.NewEnvelope(tc.fleet, nil, tc.cmd, t0, tc.timeout)
		requireOnly(t, err, protocol.ErrInvalid)
		require.Error(t, err, name)
	}
}

func TestNewIDsDiffer(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := protocol.NewID()
		require.Len(t, id, 32)
		require.False(t, seen[id])
		seen[id] = true
	}
}

func TestCommandValidation(t *testing.T) {
	bad := map[string]any{
		"pause mode":         protocol.Pause{Mode: ""},
		"sleep level":        protocol.Sleep{Level: 3},
		"sleep negative":     protocol.Sleep{Level: -1},
		"sleep mode":         protocol.Sleep{Level: 1, Mode: "later"},
		"wake tag":           protocol.Wake{Tags: []string{"weights", "gpu"}},
		"stage version":      protocol.Stage{Weights: protocol.WeightsRef{Version: 0, URI: "u"}},
		"stage uri":          protocol.Stage{Weights: protocol.WeightsRef{Version: 1}},
		"stage sha not hex":  protocol.Stage{Weights: protocol.WeightsRef{Version: 1, URI: "u", SHA256: strings.Repeat("zz", 32)}},
		"stage sha short":    protocol.Stage{Weights: protocol.WeightsRef{Version: 1, URI: "u", SHA256: "abcd"}},
		"commit version":     protocol.Commit{Version: 0, Mode: protocol.ModeAbort},
		"commit mode":        protocol.Commit{Version: 1, Mode: "x"},
		"commit sleep level": protocol.Commit{Version: 1, Mode: protocol.ModeAbort, SleepLevel: 5, SHA256: digest},
		"commit without sha": protocol.Commit{Version: 1, Mode: protocol.ModeAbort},
		"stage without sha":  protocol.Stage{Weights: protocol.WeightsRef{Version: 1, URI: "u"}},
	}
	for name, cmd := range bad {
		err := cmd.(interface{ Validate() error }).Validate()
		requireOnly(t, err, protocol.ErrInvalid)
		_, err = protocol.NewEnvelope("f", nil, cmd, t0, time.Second)
		require.ErrorIs(t, err, protocol.ErrInvalid, name)
	}
	for kind, cmd := range commands() {
		require.NoError(t, cmd.(interface{ Validate() error }).Validate(), kind)
	}
	require.NoError(t, protocol.Sleep{Level: 0}.Validate())
	require.NoError(t, protocol.Wake{}.Validate())
	require.NoError(t, protocol.WeightsRef{Version: 1, URI: "u"}.Validate(), "a ref alone may lack a digest; a stage may not")
}

func TestKinds(t *testing.T) {
	for _, k := range protocol.Kinds() {
		require.True(t, k.Valid(), k)
	}
	require.False(t, protocol.Kind("reboot").Valid())
	require.False(t, protocol.Kind("").Valid())
}

func TestForServer(t *testing.T) {
	e := envelope(t, protocol.Resume{})
	require.True(t, e.ForServer("s1"))
	require.False(t, e.ForServer("s3"))
	e.Targets = nil
	require.True(t, e.ForServer("anyone"), "no targets: every server")
}

func TestCommandStrictBody(t *testing.T) {
	e := envelope(t, protocol.Pause{Mode: protocol.ModeAbort})
	for name, body := range map[string]string{
		"unknown field":  `{"mode":"abort","clear_cache":false,"force":true}`,
		"trailing data":  `{"mode":"abort"} {}`,
		"wrong type":     `{"mode":1}`,
		"not json":       `mode=abort`,
		"invalid value":  `{"mode":"never"}`,
		"empty":          ``,
		"array for body": `[]`,
	} {
		e.Body = json.RawMessage(body)
		_, err := e.Command()
		require.Error(t, err, name)
		if name == "invalid value" {
			requireOnly(t, err, protocol.ErrInvalid)
		} else {
			requireOnly(t, err, protocol.ErrMalformed)
		}
	}
	e.Kind = "reboot"
	e.Body = json.RawMessage(`{}`)
	_, err := e.Command()
	requireOnly(t, err, protocol.ErrMalformed)
}

// mutations returns, for every field reachable in the struct v points to (descending into
// pointers to structs, which it also sets nil or non-nil), a description and a function that
// changes that one field. skip names top-level fields to leave alone.
func mutations(v any, skip ...string) map[string]func() {
	out := map[string]func(){}
	var walk func(path string, f reflect.Value)
	walk = func(path string, f reflect.Value) {
		switch f.Kind() {
		case reflect.String:
			out[path] = func() { f.SetString(f.String() + "x") }
		case reflect.Int, reflect.Int64:
			out[path] = func() { f.SetInt(f.Int() + 1) }
		case reflect.Bool:
			out[path] = func() { f.SetBool(!f.Bool()) }
		case reflect.Float64:
			out[path] = func() { f.SetFloat(f.Float() + 0.25) }
		case reflect.Slice:
			if f.Type().Elem().Kind() == reflect.Uint8 { // json.RawMessage
				out[path] = func() { f.SetBytes([]byte(`{"mode":"wait","clear_cache":false}`)) }
				return
			}
			if f.Type().Elem().Kind() == reflect.Int64 { // Holds
				out[path+"+"] = func() { f.Set(reflect.Append(f, reflect.ValueOf(int64(7)))) }
				if f.Len() > 0 {
					out[path+"[0]"] = func() { f.Index(0).SetInt(f.Index(0).Int() + 1) }
				}
				return
			}
			out[path+"+"] = func() { f.Set(reflect.Append(f, reflect.ValueOf("extra"))) }
			if f.Len() > 0 {
				out[path+"[0]"] = func() { f.Index(0).SetString(f.Index(0).String() + "x") }
			}
		case reflect.Map:
			out[path+"+"] = func() {
				if f.IsNil() {
					f.Set(reflect.MakeMap(f.Type()))
				}
				f.SetMapIndex(reflect.ValueOf("extra"), reflect.ValueOf("v"))
			}
		case reflect.Pointer:
			if f.IsNil() {
				out[path+"=new"] = func() { f.Set(reflect.New(f.Type().Elem())) }
				return
			}
			out[path+"=nil"] = func() { f.Set(reflect.Zero(f.Type())) }
			for i := range f.Elem().NumField() {
				walk(path+"."+f.Elem().Type().Field(i).Name, f.Elem().Field(i))
			}
		default:
			panic(fmt.Sprintf("mutations: no mutation for %s (%s)", path, f.Kind()))
		}
	}
	s := reflect.ValueOf(v).Elem()
	for i := range s.NumField() {
		name := s.Type().Field(i).Name
		if !slices.Contains(skip, name) {
			walk(name, s.Field(i))
		}
	}
	return out
}

// signed is what the three signed message types have in common.
type signed interface {
	Canonical() []byte
	Sign(secret []byte)
}

// Tampering with any single field of a signed message changes its canonical bytes, so the
// signature no longer matches; the reflection walk covers fields added later automatically.
func TestTamperingAnyFieldBreaksTheSignature(t *testing.T) {
	fresh := map[string]func() signed{
		"envelope": func() signed {
			e := envelope(t, protocol.Pause{Mode: protocol.ModeAbort})
			return e
		},
		"heartbeat": func() signed { return heartbeat() },
		"heartbeat without optional fields": func() signed {
			return &protocol.Heartbeat{V: protocol.Version, Fleet: "f", ServerID: "s1"}
		},
		"desired":              func() signed { return desired() },
		"desired without refs": func() signed { return &protocol.DesiredState{V: protocol.Version, Fleet: "f", Epoch: 1} },
	}
	for name, mk := range fresh {
		t.Run(name, func(t *testing.T) {
			base := mk()
			base.Sign(secret)
			n := 0
			for field := range mutations(base, "Sig", "MACs") {
				m := mk()
				m.Sign(secret)
				sig := sigOf(m)
				mutations(m, "Sig", "MACs")[field]()
				require.NotEqual(t, base.Canonical(), m.Canonical(), "changing %s leaves the canonical bytes alone", field)
				require.Equal(t, sig, sigOf(m))
				requireOnly(t, verify(m, fleetOf(m)), badSigOrVersion(field))
				n++
			}
			require.Positive(t, n)
		})
	}
}

// badSigOrVersion is how a one-field change is refused: V as a version mismatch and an
// unknown Kind as malformed, both before the signature is read (TestEnvelopeVerify swaps Kind
// for another valid one); everything else as a bad signature.
func badSigOrVersion(field string) error {
	switch field {
	case "V":
		return protocol.ErrVersion
	case "Kind":
		return protocol.ErrMalformed
	case "Weights=new", "PauseMode", "Weights.SHA256", "Rolling=new", "Rolling.SHA256":
		// A desired state's content is checked before its signature: a ref without
		// version and digest, a pause mode or sleep level out of range.
		return protocol.ErrInvalid
	}
	return protocol.ErrBadSignature
}

// Tampering with any single field of a signed ack changes its canonical bytes; the fleet
// name is bound too, so an ack cannot be replayed into another fleet.
func TestTamperingAnyAckFieldBreaksItsSignature(t *testing.T) {
	mk := func() *protocol.Ack {
		return &protocol.Ack{V: protocol.Version, CommandID: "c1", ServerID: "s1", Kind: protocol.KindCommit, Result: protocol.ResultOK,
			Code: "x", Error: "e", Phases: []protocol.Phase{{Name: "pause", OK: true, Seconds: 0.5, Detail: map[string]int64{"a": 1}}},
			WeightVersion: 3, StagedVersion: 4, WeightSHA256: digest, LastTokenBefore: 5, FirstTokenAfter: 6, Duplicate: true, At: 7}
	}
	base := mk()
	base.Sign(secret, "f")
	require.NoError(t, base.Verify(secret, "f"))
	require.ErrorIs(t, base.Verify(secret, "g"), protocol.ErrBadSignature, "bound to its fleet")
	require.ErrorIs(t, (&protocol.Ack{V: 1}).Verify(secret, "f"), protocol.ErrUnsigned)
	n := 0
	for field := range mutations(base, "Sig", "Phases") {
		m := mk()
		m.Sig = base.Sig
		mutations(m, "Sig", "Phases")[field]()
		require.ErrorIs(t, m.Verify(secret, "f"), protocol.ErrBadSignature, "changing %s", field)
		n++
	}
	require.Greater(t, n, 10)
	// Phases are walked as a whole by mutations; change each part of one by hand.
	for name, change := range map[string]func(*protocol.Ack){
		"phase name":    func(a *protocol.Ack) { a.Phases[0].Name = "resume" },
		"phase ok":      func(a *protocol.Ack) { a.Phases[0].OK = false },
		"phase seconds": func(a *protocol.Ack) { a.Phases[0].Seconds = 9 },
		"phase detail":  func(a *protocol.Ack) { a.Phases[0].Detail["a"] = 2 },
		"phase error":   func(a *protocol.Ack) { a.Phases[0].Error = "boom" },
	} {
		m := mk()
		m.Sig = base.Sig
		change(m)
		require.ErrorIs(t, m.Verify(secret, "f"), protocol.ErrBadSignature, name)
	}
}

func heartbeat() *protocol.Heartbeat {
	return &protocol.Heartbeat{
		V: protocol.Version, Fleet: "f", ServerID: "s1", State: protocol.StateRunning,
		WeightVersion: 3, StagedVersion: 4, Epoch: 9, InRotation: true, Running: 5, Waiting: 2,
		KVUsage: 0.375, AdvertiseURL: "http://10.0.0.1:8000", Build: "v1.2.3", Error: "fetch: 404", PeerURL: "http://10.0.0.1:8000/weights", Holds: []int64{3, 4},
		WeightSHA256: digest, DesiredEpoch: 12, At: t0.UnixMilli(),
	}
}

func desired() *protocol.DesiredState {
	return &protocol.DesiredState{
		V: protocol.Version, Fleet: "f", Epoch: 12,
		Weights: &protocol.WeightsRef{Version: 4, URI: "http://w/v4", SHA256: digest},
		Plan:    &protocol.Commit{Version: 4, Mode: protocol.ModeKeep, ClearCache: true, SleepLevel: 1, SHA256: digest},
		Paused:  true, PauseMode: protocol.ModeKeep, Sleep: 1, Signed: true, UpdatedAt: t0.UnixMilli(),
		Rolling: &protocol.WeightsRef{Version: 5, URI: "http://w/v5", SHA256: digest},
	}
}

func sigOf(m signed) string {
	return reflect.ValueOf(m).Elem().FieldByName("Sig").String()
}

func fleetOf(m signed) string {
	return reflect.ValueOf(m).Elem().FieldByName("Fleet").String()
}

func verify(m signed, fleet string) error {
	switch m := m.(type) {
	case *protocol.Envelope:
		return m.Verify(secret, fleet, t0)
	case *protocol.Heartbeat:
		if m.V != protocol.Version {
			return protocol.ErrVersion // heartbeats check V when decoded
		}
		return m.Verify(secret, fleet)
	case *protocol.DesiredState:
		if m.V != protocol.Version {
			return protocol.ErrVersion
		}
		if m.Weights != nil && m.Weights.Validate() != nil {
			// A tampered ref that no longer validates is refused for that; make it valid
			// again so the test sees the signature check.
			m.Weights.Version = max(m.Weights.Version, 1)
			m.Weights.URI += "u"
			m.Weights.SHA256 = ""
		}
		return m.Verify(secret, fleet)
	}
	panic("unknown message")
}

// Field boundaries are part of the canonical bytes: moving characters from one field into
// the next changes them.
func TestCanonicalFieldBoundaries(t *testing.T) {
	a := envelope(t, protocol.Resume{})
	b := *a
	a.ID, a.Fleet = "ab", "c"
	b.ID, b.Fleet = "a", "bc"
	require.NotEqual(t, a.Canonical(), b.Canonical())

	h1, h2 := heartbeat(), heartbeat()
	h1.Build, h1.Error = "x", ""
	h2.Build, h2.Error = "", "x"
	require.NotEqual(t, h1.Canonical(), h2.Canonical())

	// Moving a target into the trace or swapping tags is not the same message either.
	c, d := envelope(t, protocol.Resume{}), envelope(t, protocol.Resume{})
	d.ID = c.ID
	c.Targets = []string{"a", "b"}
	d.Targets = []string{"ab"}
	require.NotEqual(t, c.Canonical(), d.Canonical())
}

// How the sender wrote its JSON (key order, whitespace, escapes, target order) does not
// change what was signed.
func TestSignatureSurvivesReencoding(t *testing.T) {
	e := envelope(t, protocol.Pause{Mode: protocol.ModeAbort, ClearCache: true})
	e.Sign(secret)
	require.NoError(t, e.Verify(secret, "f", t0))

	for _, body := range []string{
		`{"clear_cache":true,"mode":"abort"}`,
		"{ \"mode\" : \"abort\" ,\n\t\"clear_cache\": true }",
		`{"mode":"\u0061bort","clear_cache":true}`,
	} {
		m := *e
		m.Body = json.RawMessage(body)
		require.NoError(t, m.Verify(secret, "f", t0), body)
		cmd, err := m.Command()
		require.NoError(t, err)
		require.Equal(t, protocol.Pause{Mode: protocol.ModeAbort, ClearCache: true}, cmd)
	}
	m := *e
	m.Targets = []string{"s1", "s2"}
	require.NoError(t, m.Verify(secret, "f", t0), "target order is not signed")

	// The whole envelope re-encoded by another encoder (keys in another order, indented).
	b, err := e.Encode()
	require.NoError(t, err)
	var generic map[string]any
	require.NoError(t, json.Unmarshal(b, &generic))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "   ")
	require.NoError(t, enc.Encode(generic))
	got, err := protocol.DecodeEnvelope(buf.Bytes())
	require.NoError(t, err)
	require.NoError(t, got.Verify(secret, "f", t0))

	// A different value is a different message, whatever the spelling.
	m = *e
	m.Body = json.RawMessage(`{"clear_cache":false,"mode":"abort"}`)
	requireOnly(t, m.Verify(secret, "f", t0), protocol.ErrBadSignature)
}

func TestEnvelopeVerify(t *testing.T) {
	signedEnv := func() *protocol.Envelope {
		e := envelope(t, protocol.Resume{})
		e.Targets = nil // to every server: the trainer key's signature (TestCommandMACs has the MACs)
		e.Sign(secret)
		return e
	}
	deadline := t0.Add(5 * time.Second)

	e := signedEnv()
	require.NoError(t, e.Verify(secret, "f", t0))
	require.NoError(t, e.Verify(secret, "f", deadline), "valid up to its deadline")
	requireOnly(t, e.Verify(secret, "f", deadline.Add(time.Millisecond)), protocol.ErrExpired)
	requireOnly(t, e.Verify(secret, "g", t0), protocol.ErrWrongFleet)
	requireOnly(t, e.Verify(other, "f", t0), protocol.ErrBadSignature)

	e.Sig = ""
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrUnsigned)
	require.NoError(t, e.Verify(nil, "f", t0), "without a secret the fleet is unsigned")
	e.Sig = "not hex"
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrBadSignature)
	require.NoError(t, e.Verify(nil, "f", t0), "without a secret a signature is ignored")
	e.Sig = strings.Repeat("0", 64)
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrBadSignature)
	e = signedEnv()
	e.Sig = e.Sig[:62] + map[bool]string{true: "00", false: "ff"}[e.Sig[62:] != "00"]
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrBadSignature)

	// Order: version, then fleet, then signature, then deadline.
	e = signedEnv()
	e.V = 2
	e.Fleet = "g"
	requireOnly(t, e.Verify(secret, "f", deadline.Add(time.Hour)), protocol.ErrVersion)
	e = signedEnv()
	e.Fleet = "g" // wrong fleet and (therefore) a bad signature, and expired
	requireOnly(t, e.Verify(secret, "f", deadline.Add(time.Hour)), protocol.ErrWrongFleet)
	e = signedEnv()
	e.Sig = ""
	requireOnly(t, e.Verify(secret, "f", deadline.Add(time.Hour)), protocol.ErrUnsigned)
	e = signedEnv()
	e.Deadline++ // bad signature and, at that time, expired
	requireOnly(t, e.Verify(secret, "f", deadline.Add(time.Hour)), protocol.ErrBadSignature)

	e = signedEnv()
	e.Kind = protocol.KindAbort // another valid command under the same signature
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrBadSignature)

	e = signedEnv()
	e.ID = ""
	e.Sign(secret)
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrMalformed)
	e = signedEnv()
	e.Kind = "reboot"
	e.Sign(secret)
	requireOnly(t, e.Verify(secret, "f", t0), protocol.ErrMalformed)
}

func TestHeartbeatAndDesiredVerify(t *testing.T) {
	h := heartbeat()
	require.NoError(t, h.Verify(nil, "f"), "unsigned fleet")
	requireOnly(t, h.Verify(secret, "f"), protocol.ErrUnsigned)
	h.Sign(secret)
	require.NoError(t, h.Verify(secret, "f"))
	requireOnly(t, h.Verify(other, "f"), protocol.ErrBadSignature)
	requireOnly(t, h.Verify(secret, "g"), protocol.ErrWrongFleet)

	d := desired()
	requireOnly(t, d.Verify(secret, "f"), protocol.ErrUnsigned)
	d.Sign(secret)
	require.NoError(t, d.Verify(secret, "f"))
	requireOnly(t, d.Verify(other, "f"), protocol.ErrBadSignature)
	requireOnly(t, d.Verify(secret, "g"), protocol.ErrWrongFleet)
	d.Weights.Version = 0
	d.Sign(secret)
	requireOnly(t, d.Verify(secret, "f"), protocol.ErrInvalid)
}

func TestMessageRoundTrips(t *testing.T) {
	h := heartbeat()
	h.Sign(secret)
	b, err := h.Encode()
	require.NoError(t, err)
	gh, err := protocol.DecodeHeartbeat(b)
	require.NoError(t, err)
	require.Equal(t, h, gh)
	require.NoError(t, gh.Verify(secret, "f"))

	d := desired()
	d.Sign(secret)
	b, err = d.Encode()
	require.NoError(t, err)
	gd, err := protocol.DecodeDesiredState(b)
	require.NoError(t, err)
	require.Equal(t, d, gd)
	require.NoError(t, gd.Verify(secret, "f"))

	empty := &protocol.DesiredState{V: protocol.Version, Fleet: "f"}
	b, err = empty.Encode()
	require.NoError(t, err)
	ge, err := protocol.DecodeDesiredState(b)
	require.NoError(t, err)
	require.Equal(t, empty, ge)

	a := &protocol.Ack{
		V: protocol.Version, CommandID: protocol.NewID(), ServerID: "s1", Kind: protocol.KindCommit,
		Result: protocol.ResultFailed, Code: "digest_mismatch", Error: "sha256 differs",
		Phases: []protocol.Phase{
			{Name: "pause", OK: true, Seconds: 0.004, Detail: map[string]int64{"blocks_cleared": 12}},
			{Name: "swap", OK: false, Error: "digest", Seconds: 0.5},
		},
		WeightVersion: 3, StagedVersion: 4, LastTokenBefore: 10, FirstTokenAfter: 20, Duplicate: true,
		At: t0.UnixMilli(),
	}
	b, err = a.Encode()
	require.NoError(t, err)
	ga, err := protocol.DecodeAck(b)
	require.NoError(t, err)
	require.Equal(t, a, ga)
}

func TestStrictDecoding(t *testing.T) {
	env, err := envelope(t, protocol.Resume{}).Encode()
	require.NoError(t, err)
	hb, err := heartbeat().Encode()
	require.NoError(t, err)
	ds, err := desired().Encode()
	require.NoError(t, err)
	ack, err := (&protocol.Ack{V: protocol.Version, CommandID: "c", ServerID: "s", Kind: protocol.KindPause, Result: protocol.ResultOK}).Encode()
	require.NoError(t, err)

	decoders := map[string]struct {
		valid  []byte
		decode func([]byte) error
	}{
		"envelope":  {env, func(b []byte) error { _, err := protocol.DecodeEnvelope(b); return err }},
		"heartbeat": {hb, func(b []byte) error { _, err := protocol.DecodeHeartbeat(b); return err }},
		"desired":   {ds, func(b []byte) error { _, err := protocol.DecodeDesiredState(b); return err }},
		"ack":       {ack, func(b []byte) error { _, err := protocol.DecodeAck(b); return err }},
	}
	for name, d := range decoders {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, d.decode(d.valid))
			require.NoError(t, d.decode(append(bytes.Clone(d.valid), " \n\t"...)), "trailing whitespace is fine")

			withField := append(bytes.Clone(d.valid[:len(d.valid)-1]), `,"extra":1}`...)
			requireOnly(t, d.decode(withField), protocol.ErrMalformed)
			requireOnly(t, d.decode(append(bytes.Clone(d.valid), `{}`...)), protocol.ErrMalformed)
			requireOnly(t, d.decode(append(bytes.Clone(d.valid), `x`...)), protocol.ErrMalformed)
			requireOnly(t, d.decode(d.valid[:len(d.valid)-1]), protocol.ErrMalformed)
			requireOnly(t, d.decode([]byte(`[]`)), protocol.ErrMalformed)
			requireOnly(t, d.decode(nil), protocol.ErrMalformed)
			requireOnly(t, d.decode([]byte(`"v"`)), protocol.ErrMalformed)

			var m map[string]any
			require.NoError(t, json.Unmarshal(d.valid, &m))
			for _, v := range []any{0, 2, nil} {
				if v == nil {
					delete(m, "v")
				} else {
					m["v"] = v
				}
				b, err := json.Marshal(m)
				require.NoError(t, err)
				requireOnly(t, d.decode(b), protocol.ErrVersion)
			}

			// Oversize is refused before it is parsed.
			big := append(bytes.Clone(d.valid), bytes.Repeat([]byte(" "), protocol.MaxMessageBytes)...)
			requireOnly(t, d.decode(big), protocol.ErrTooLarge)
		})
	}
	_, err = protocol.DecodeHeartbeat([]byte(`{"v":1,"fleet":"f"}`))
	requireOnly(t, err, protocol.ErrMalformed)
}

func TestEncodeRefusesOversize(t *testing.T) {
	e := envelope(t, protocol.Abort{RequestIDs: []string{strings.Repeat("r", protocol.MaxMessageBytes)}})
	_, err := e.Encode()
	requireOnly(t, err, protocol.ErrTooLarge)
	h := heartbeat()
	h.Error = strings.Repeat("e", protocol.MaxMessageBytes)
	_, err = h.Encode()
	requireOnly(t, err, protocol.ErrTooLarge)
}

func TestCheckSecret(t *testing.T) {
	require.NoError(t, protocol.CheckSecret(nil), "no secret: unsigned")
	require.NoError(t, protocol.CheckSecret([]byte{}))
	requireOnly(t, protocol.CheckSecret([]byte("short")), protocol.ErrShortSecret)
	requireOnly(t, protocol.CheckSecret(bytes.Repeat([]byte("k"), protocol.MinSecretBytes-1)), protocol.ErrShortSecret)
	require.NoError(t, protocol.CheckSecret(bytes.Repeat([]byte("k"), protocol.MinSecretBytes)))
}

func TestNames(t *testing.T) {
	n := protocol.Names{Fleet: "prod"}
	keys := []string{n.Control(), n.Desired(), n.HeartbeatPrefix(), n.Heartbeat("s1"), n.Acks("c1")}
	for _, k := range keys {
		require.True(t, strings.HasPrefix(k, "rollout:{prod}:"), k)
	}
	require.True(t, strings.HasPrefix(n.Heartbeat("s1"), n.HeartbeatPrefix()))
	require.False(t, strings.HasPrefix(n.Desired(), n.HeartbeatPrefix()))
	seen := map[string]bool{}
	for _, k := range keys {
		require.False(t, seen[k], "two names collide: %s", k)
		seen[k] = true
	}
	require.NotEqual(t, n.Control(), protocol.Names{Fleet: "dev"}.Control())
}

func TestErrorsAreDistinct(t *testing.T) {
	for i, a := range sentinels {
		for j, b := range sentinels {
			if i != j {
				require.False(t, errors.Is(a, b), "%v is %v", a, b)
			}
		}
	}
}

func TestPeerToken(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	tok := protocol.PeerToken(secret, "f", 3, sha)
	require.True(t, strings.HasPrefix(tok, "ed25519:"), tok)
	require.Equal(t, tok, protocol.PeerToken(secret, "f", 3, sha), "deterministic: a secret holder computes the trainer's grant")
	require.True(t, protocol.CheckPeerToken(secret, "f", 3, strings.ToUpper(sha), tok))
	require.False(t, protocol.CheckPeerToken(secret, "f", 4, sha, tok), "a token opens one version only")
	require.False(t, protocol.CheckPeerToken(secret, "g", 3, sha, tok), "nor another fleet's")
	require.False(t, protocol.CheckPeerToken(secret, "f", 3, sha, ""))
	require.Empty(t, protocol.PeerToken(nil, "f", 3, sha), "unsigned fleets take no token")
	require.True(t, protocol.CheckPeerToken(nil, "f", 3, sha, ""))
}

func TestStageSources(t *testing.T) {
	ref := protocol.WeightsRef{Version: 1, URI: "http://o/v1/", SHA256: digest}
	require.NoError(t, protocol.Stage{Weights: ref, Sources: map[string]string{"a": "b"}}.Validate())
	require.ErrorIs(t, protocol.Stage{Weights: ref, Sources: map[string]string{"a": "a"}}.Validate(), protocol.ErrInvalid)
	require.ErrorIs(t, protocol.Stage{Weights: ref, Sources: map[string]string{"a": ""}}.Validate(), protocol.ErrInvalid)
}
