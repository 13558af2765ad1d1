package trainer

import (
	"math"

	"github.com/rolloutkit/rollout/engine/kernels"
	"github.com/rolloutkit/rollout/engine/model"
)

// Schedule names a learning-rate schedule after the warmup.
type Schedule string

// Learning-rate schedules.
const (
	// ScheduleConstant keeps the peak rate after the warmup.
	ScheduleConstant Schedule = "constant"
	// ScheduleCosine decays from the peak rate to MinLR by TotalSteps along a half cosine.
	ScheduleCosine Schedule = "cosine"
)

// LRAt is the learning rate of update number step (0-based): a linear warmup over WarmupSteps
// from LR/WarmupSteps to LR, then constant or cosine decay to MinLR at TotalSteps (and MinLR
// after). c must have its defaults applied (see Config).
func (c Config) LRAt(step int) float64 {
	if step < c.WarmupSteps {
		return c.LR * float64(step+1) / float64(c.WarmupSteps)
	}
	if c.Schedule != ScheduleCosine {
		return c.LR
	}
	span := max(1, c.TotalSteps-c.WarmupSteps)
	p := min(1, float64(step-c.WarmupSteps)/float64(span))
	return c.MinLR + (c.LR-c.MinLR)*0.5*(1+math.Cos(math.Pi*p))
}

// adamW holds AdamW's moments, shaped like the parameters.
type adamW struct {
	m, v  *params[float32]
	decay []bool // per tensor: weight decay applies (matrices and embeddings, not norm gains)
}

func newAdamW(c model.Config) *adamW {
	a := &adamW{m: newParams[float32](c), v: newParams[float32](c)}
	for _, t := range (&model.Weights{Config: c}).Tensors() {
		a.decay = append(a.decay, len(t.Shape) > 1)
	}
	return a
}

// gradNorm is the global L2 norm of all gradients. Each tensor's sum of squares is split
// into a fixed number of ranges, so the result does not depend on timing.
func gradNorm(pool *kernels.Pool, g *params[float32]) float64 {
	s := 0.0
	parts := make([]float64, pool.Workers())
	for _, t := range g.tensors() {
		x := *t
		clear(parts)
		pool.Parallel(len(parts), func(lo, hi int) {
			for w := lo; w < hi; w++ {
				kernels.ClearUpper()
				ss := 0.0
				for _, v := range x[w*len(x)/len(parts) : (w+1)*len(x)/len(parts)] {
					ss += float64(v) * float64(v)
				}
				parts[w] = ss
			}
		})
		for _, p := range parts {
			s += p
		}
	}
	return math.Sqrt(s)
}

// update applies one AdamW step (decoupled weight decay, bias-corrected moments) of update
// number step (1-based) to p with gradients g scaled by gscale (the clipping factor).
func (a *adamW) update(pool *kernels.Pool, p, g *params[float32], step int, lr, b1, b2, eps, wd, gscale float64) {
	bc1 := 1 - math.Pow(b1, float64(step))
	bc2 := 1 - math.Pow(b2, float64(step))
	ms, vs, gs := a.m.tensors(), a.v.tensors(), g.tensors()
	for i, pt := range p.tensors() {
		pw, m, v, gr := *pt, *ms[i], *vs[i], *gs[i]
		decay := 0.0
		if a.decay[i] {
			decay = wd
		}
		pool.Parallel(len(pw), func(lo, hi int) {
			kernels.ClearUpper()
			for j := lo; j < hi; j++ {
				gj := float64(gr[j]) * gscale
				mj := b1*float64(m[j]) + (1-b1)*gj
				vj := b2*float64(v[j]) + (1-b2)*gj*gj
				m[j], v[j] = float32(mj), float32(vj)
				x := float64(pw[j])
				x -= lr * ((mj/bc1)/(math.Sqrt(vj/bc2)+eps) + decay*x)
				pw[j] = float32(x)
			}
		})
	}
}
