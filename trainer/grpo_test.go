package trainer

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdvantages(t *testing.T) {
	s := []Sample{{Reward: 1, Group: 0}, {Reward: 0, Group: 0}, {Reward: 0.5, Group: 1}, {Reward: 0.5, Group: 1},
		{Reward: 3, Group: 2}, {Reward: 1, Group: 2}, {Reward: 2, Group: 2}}
	a, err := Advantages(s, false)
	require.NoError(t, err)
	require.InDelta(t, 1, a[0], 1e-5)
	require.InDelta(t, -1, a[1], 1e-5)
	require.Equal(t, 0.0, a[2]) // equal rewards: no signal
	require.Equal(t, 0.0, a[3])
	std := math.Sqrt(2.0 / 3)
	require.InDelta(t, 1/std, a[4], 1e-5)
	require.InDelta(t, 0, a[6], 1e-12)

	d, err := Advantages(s, true) // Dr.GRPO: no std normalisation
	require.NoError(t, err)
	require.InDelta(t, 0.5, d[0], 1e-12)
	require.InDelta(t, 1, d[4], 1e-12)

	_, err = Advantages([]Sample{{Group: 0}, {Group: 0}, {Group: 1}}, false)
	require.ErrorIs(t, err, ErrGroupTooSmall)
	_, err = Advantages(nil, false)
	require.ErrorIs(t, err, ErrEmptyBatch)
	_, err = Advantages([]Sample{{Reward: math.NaN()}, {}}, false)
	require.ErrorIs(t, err, ErrInvalidSample)
}

// TestTokenTerm checks each regime of the token loss and that grad is d loss / d logp.
func TestTokenTerm(t *testing.T) {
	lp := lossParams{clipLow: 0.2, clipHigh: 0.28, tisCap: 2, klCoef: 0.1, version: 5}
	cases := []struct {
		name                     string
		logp, rollout, ref, adv  float64
		version                  int64
		clipped, truncated, zero bool
	}{
		{"on-policy inside clip", -1.0, -1.05, -1.2, 1.5, 5, false, false, false},
		{"on-policy clipped high", -0.5, -1.0, -0.7, 1, 5, true, false, true},
		{"on-policy clipped low, negative advantage", -2, -1, -1.5, -1, 5, true, false, true},
		{"on-policy ratio high, negative advantage: not clipped", -0.5, -1.0, -0.6, -1, 5, false, false, false},
		{"stale under cap", -1, -1.3, -1.1, 0.7, 3, false, false, false},
		{"stale over cap", -0.2, -3, -1, 0.7, 4, false, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tt := lp.term(c.logp, c.rollout, c.ref, c.adv, c.version)
			require.Equal(t, c.clipped, tt.clipped)
			require.Equal(t, c.truncated, tt.truncated)
			require.Equal(t, c.version < lp.version, tt.stale)
			kl := math.Exp(c.ref-c.logp) - (c.ref - c.logp) - 1
			require.InDelta(t, kl, tt.kl, 1e-12)
			klGrad := lp.klCoef * (1 - math.Exp(c.ref-c.logp))
			if c.zero {
				require.InDelta(t, klGrad, tt.grad, 1e-12, "a clipped token only keeps the KL gradient")
			}
			if !tt.stale {
				// On-policy, the loss is a function of logp: check grad by finite differences.
				const h = 1e-6
				up := lp.term(c.logp+h, c.rollout, c.ref, c.adv, c.version).loss
				dn := lp.term(c.logp-h, c.rollout, c.ref, c.adv, c.version).loss
				require.InDelta(t, (up-dn)/(2*h), tt.grad, 1e-6)
			} else {
				// Off-policy, the importance weight is detached: grad = -min(r, cap)·A + KL term.
				w := min(math.Exp(c.logp-c.rollout), lp.tisCap)
				require.InDelta(t, -w*c.adv+klGrad, tt.grad, 1e-12)
			}
		})
	}
}
