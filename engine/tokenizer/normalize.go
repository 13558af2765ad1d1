package tokenizer

import (
	"encoding/json"
	"fmt"

	"golang.org/x/text/unicode/norm"
)

// hfNormalizers maps the Unicode normalizers of tokenizer.json to their forms.
var hfNormalizers = map[string]norm.Form{"NFC": norm.NFC, "NFD": norm.NFD, "NFKC": norm.NFKC, "NFKD": norm.NFKD}

// parseNormalizer returns the forms a tokenizer.json normalizer applies, in order: none for
// null or an empty Sequence, and a Sequence (possibly nested) of NFC/NFD/NFKC/NFKD. Any
// other normalizer changes text in ways this package does not reproduce, so it is refused.
func parseNormalizer(raw json.RawMessage, forms []norm.Form) ([]norm.Form, error) {
	if isNull(raw) {
		return forms, nil
	}
	var c struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.json: normalizer: %w", ErrMalformed, err)
	}
	if c.Type == "Sequence" {
		for _, n := range c.Normalizers {
			var err error
			if forms, err = parseNormalizer(n, forms); err != nil {
				return nil, err
			}
		}
		return forms, nil
	}
	f, ok := hfNormalizers[c.Type]
	if !ok {
		return nil, fmt.Errorf("%w: tokenizer.json: normalizer %q (only NFC, NFD, NFKC, NFKD and Sequences of them are supported)",
			ErrUnsupported, c.Type)
	}
	return append(forms, f), nil
}

// normalize applies t's normalizers to s; each returns s itself when it is already normal.
func (t *HF) normalize(s string) string {
	for _, f := range t.norms {
		s = f.String(s)
	}
	return s
}
