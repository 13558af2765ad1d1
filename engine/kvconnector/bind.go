package kvconnector

import (
	"context"
	"errors"
)

// ErrForeignMetadata is returned by a bound worker side's HandlePreemptions for a step whose
// metadata another Bind's scheduler side built: the engine was given the two sides of different
// connectors.
var ErrForeignMetadata = errors.New("kvconnector: step metadata from another connector's scheduler side")

// Bind joins the two sides of one connector into what the scheduler and the engine drive. Both
// sides name the same payload types, so a worker side expecting another payload than its
// scheduler side builds does not compile. The adapters forward PoolBinder, StorageBinder,
// StepFailer and LoadErrorReporter to the sides that implement them.
func Bind[P, W any](s TypedScheduler[P, W], w TypedWorker[P, W]) (Scheduler, Worker) {
	b := &binding{}
	return &boundScheduler[P, W]{inner: s, b: b}, &boundWorker[P, W]{inner: w, b: b}
}

// open returns the payload of x if the binding b sealed it, the zero P for a zero Sealed, and
// ok false for one another binding sealed.
func open[P any](x Sealed, b *binding) (p P, ok bool) {
	if x.from == nil {
		return p, true
	}
	if x.from != b {
		return p, false
	}
	p, _ = x.v.(P)
	return p, true
}

type boundScheduler[P, W any] struct {
	inner TypedScheduler[P, W]
	b     *binding
}

var (
	_ Scheduler  = (*boundScheduler[int, int])(nil)
	_ PoolBinder = (*boundScheduler[int, int])(nil)
)

func (s *boundScheduler[P, W]) OnNewRequest(req Request) { s.inner.OnNewRequest(req) }

func (s *boundScheduler[P, W]) GetNumNewMatchedTokens(req Request, numComputedTokens int) (int, bool) {
	return s.inner.GetNumNewMatchedTokens(req, numComputedTokens)
}

func (s *boundScheduler[P, W]) UpdateStateAfterAlloc(req Request, blockIDs []int, numExternalTokens int) {
	s.inner.UpdateStateAfterAlloc(req, blockIDs, numExternalTokens)
}

func (s *boundScheduler[P, W]) BuildConnectorMeta(step StepInfo) Metadata {
	m := s.inner.BuildConnectorMeta(step)
	return Metadata{Step: m.Step, FlushJobIDs: m.FlushJobIDs, Payload: Sealed{v: m.Payload, from: s.b}}
}

// UpdateConnectorOutput opens the report; one another binding sealed reaches the side as the
// zero W (its finished lists still count).
func (s *boundScheduler[P, W]) UpdateConnectorOutput(out Output) {
	wm, _ := open[W](out.WorkerMeta, s.b)
	s.inner.UpdateConnectorOutput(TypedOutput[W]{FinishedSending: out.FinishedSending, FinishedRecving: out.FinishedRecving,
		FailedRecving: out.FailedRecving, WorkerMeta: wm})
}

func (s *boundScheduler[P, W]) RequestFinished(req Request, blockIDs []int) bool {
	return s.inner.RequestFinished(req, blockIDs)
}

func (s *boundScheduler[P, W]) HasPendingPushWork() bool { return s.inner.HasPendingPushWork() }

func (s *boundScheduler[P, W]) ResetCache(ctx context.Context) (int, bool) {
	return s.inner.ResetCache(ctx)
}

func (s *boundScheduler[P, W]) TakeEvents() []Event { return s.inner.TakeEvents() }

func (s *boundScheduler[P, W]) Stats() Stats { return s.inner.Stats() }

func (s *boundScheduler[P, W]) BindBlockPool(pool BlockPool) {
	if b, ok := s.inner.(PoolBinder); ok {
		b.BindBlockPool(pool)
	}
}

type boundWorker[P, W any] struct {
	inner TypedWorker[P, W]
	b     *binding
	// foreign is set by BindMetadata for a step whose metadata another binding sealed; the
	// step fails at HandlePreemptions.
	foreign bool
}

var (
	_ Worker            = (*boundWorker[int, int])(nil)
	_ StorageBinder     = (*boundWorker[int, int])(nil)
	_ StepFailer        = (*boundWorker[int, int])(nil)
	_ LoadErrorReporter = (*boundWorker[int, int])(nil)
)

func (w *boundWorker[P, W]) BindMetadata(meta Metadata) {
	p, ok := open[P](meta.Payload, w.b)
	w.foreign = !ok
	w.inner.BindMetadata(TypedMetadata[P]{Step: meta.Step, FlushJobIDs: meta.FlushJobIDs, Payload: p})
}

func (w *boundWorker[P, W]) HandlePreemptions(ctx context.Context) error {
	if w.foreign {
		return ErrForeignMetadata
	}
	return w.inner.HandlePreemptions(ctx)
}

func (w *boundWorker[P, W]) StartLoadKV(ctx context.Context) error { return w.inner.StartLoadKV(ctx) }

func (w *boundWorker[P, W]) WaitForSave(ctx context.Context) error { return w.inner.WaitForSave(ctx) }

func (w *boundWorker[P, W]) GetFinished(finishedReqIDs []string) (finishedSending, finishedRecving []string) {
	return w.inner.GetFinished(finishedReqIDs)
}

func (w *boundWorker[P, W]) BuildWorkerMeta() Sealed {
	return Sealed{v: w.inner.BuildWorkerMeta(), from: w.b}
}

func (w *boundWorker[P, W]) ClearMetadata() {
	w.foreign = false
	w.inner.ClearMetadata()
}

func (w *boundWorker[P, W]) WaitIdle(ctx context.Context) error { return w.inner.WaitIdle(ctx) }

func (w *boundWorker[P, W]) BindKVStorage(s KVStorage) error {
	if b, ok := w.inner.(StorageBinder); ok {
		return b.BindKVStorage(s)
	}
	return nil
}

func (w *boundWorker[P, W]) ReleaseKVStorage() {
	if b, ok := w.inner.(StorageBinder); ok {
		b.ReleaseKVStorage()
	}
}

func (w *boundWorker[P, W]) FailStep() {
	if f, ok := w.inner.(StepFailer); ok {
		f.FailStep()
	}
}

func (w *boundWorker[P, W]) TakeFailedRecving() []string {
	if r, ok := w.inner.(LoadErrorReporter); ok {
		return r.TakeFailedRecving()
	}
	return nil
}

// sealer is implemented by Bind's adapters: the binding their Sealed values carry.
type sealer interface{ sealedBy() *binding }

func (s *boundScheduler[P, W]) sealedBy() *binding { return s.b }
func (w *boundWorker[P, W]) sealedBy() *binding    { return w.b }

// Open returns the payload a step's Metadata or Output carries, for code that inspects steps
// from outside a connector (tests, tools): side is either side Bind returned for that
// connector, and ok is false when x was sealed by another connector, carries nothing, or holds
// no P.
func Open[P any](x Sealed, side any) (p P, ok bool) {
	s, isBound := side.(sealer)
	if !isBound || x.from == nil || x.from != s.sealedBy() {
		return p, false
	}
	p, ok = x.v.(P)
	return p, ok
}
