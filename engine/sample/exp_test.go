package sample

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestExpNeg(t *testing.T) {
	assert.Equal(t, 1.0, expNeg(0))
	floor := math.Exp(-87)
	assert.InEpsilon(t, floor, expNeg(-87), 1e-8)
	assert.Equal(t, expNeg(-87), expNeg(-88), "clamped")
	assert.Equal(t, expNeg(-87), expNeg(-6.8e38), "finite for any finite input")
	assert.Greater(t, float32(expNeg(-1e300)), float32(0), "still a normal float32")
	worst := 0.0
	for i := 0; i <= 200000; i++ {
		d := -87 * float64(i) / 200000
		e := math.Exp(d)
		worst = math.Max(worst, math.Abs(expNeg(d)-e)/e)
	}
	assert.Less(t, worst, 1e-8)
}
