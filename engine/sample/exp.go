package sample

import "github.com/rolloutkit/rollout/engine/kernels"

// expNeg is kernels.ExpNeg, shared with the model's softmax.
func expNeg(d float64) float64 { return kernels.ExpNeg(d) }
