package sdk

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// jsonLogprob is a log-probability in JSON. JSON has no number for -Inf (a token outside the
// processed distribution), which encoding/json refuses to write, so it is null as on the
// generate wire (protocol.Logprob), and null reads back as -Inf. A value the engine computed
// (a float32) is written in its shortest float32 form, as the wire has it.
type jsonLogprob float64

// MarshalJSON implements json.Marshaler.
func (l jsonLogprob) MarshalJSON() ([]byte, error) {
	f := float64(l)
	switch {
	case math.IsInf(f, 0) || math.IsNaN(f):
		return []byte("null"), nil
	case float64(float32(f)) == f:
		return strconv.AppendFloat(nil, f, 'g', -1, 32), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler: null is -Inf.
func (l *jsonLogprob) UnmarshalJSON(b []byte) error {
	f, err := protocol.ParseLogprob(b, 64)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	*l = jsonLogprob(f)
	return nil
}

// tokenJSON is Token's JSON form.
type tokenJSON struct {
	ID            int            `json:"id"`
	Logprob       jsonLogprob    `json:"logprob"`
	WeightVersion int64          `json:"weight_version"`
	Top           []TokenLogprob `json:"top,omitempty"`
}

// MarshalJSON implements json.Marshaler: a -Inf logprob is null (see Token.Logprob), so that
// every GenerateResult has a JSON form, the one `rollout generate --json` prints.
func (t Token) MarshalJSON() ([]byte, error) {
	return json.Marshal(tokenJSON{ID: t.ID, Logprob: jsonLogprob(t.Logprob), WeightVersion: t.WeightVersion, Top: t.Top})
}

// UnmarshalJSON implements json.Unmarshaler: a null logprob is -Inf.
func (t *Token) UnmarshalJSON(b []byte) error {
	var w tokenJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*t = Token{ID: w.ID, Logprob: float64(w.Logprob), WeightVersion: w.WeightVersion, Top: w.Top}
	return nil
}

// tokenLogprobJSON is TokenLogprob's JSON form.
type tokenLogprobJSON struct {
	Token   int         `json:"token"`
	Logprob jsonLogprob `json:"logprob"`
}

// MarshalJSON implements json.Marshaler: a -Inf logprob is null.
func (t TokenLogprob) MarshalJSON() ([]byte, error) {
	return json.Marshal(tokenLogprobJSON{Token: t.Token, Logprob: jsonLogprob(t.Logprob)})
}

// UnmarshalJSON implements json.Unmarshaler: a null logprob is -Inf.
func (t *TokenLogprob) UnmarshalJSON(b []byte) error {
	var w tokenLogprobJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*t = TokenLogprob{Token: w.Token, Logprob: float64(w.Logprob)}
	return nil
}
