package kvconnector

import "context"

// Noop is a connector with no external KV tier: it never matches, never delays a free, never has
// pending work, and its metadata carries nothing. It implements both Scheduler and Worker.
type Noop struct{}

var (
	_ Scheduler = Noop{}
	_ Worker    = Noop{}
)

// OnNewRequest implements Scheduler.
func (Noop) OnNewRequest(Request) {}

// GetNumNewMatchedTokens implements Scheduler: nothing external matches.
func (Noop) GetNumNewMatchedTokens(Request, int) (int, bool) { return 0, false }

// UpdateStateAfterAlloc implements Scheduler.
func (Noop) UpdateStateAfterAlloc(Request, []int, int) {}

// BuildConnectorMeta implements Scheduler: empty metadata stamped with the step.
func (Noop) BuildConnectorMeta(step StepInfo) Metadata { return Metadata{Step: step.Step} }

// UpdateConnectorOutput implements Scheduler.
func (Noop) UpdateConnectorOutput(Output) {}

// RequestFinished implements Scheduler: blocks are freed at once.
func (Noop) RequestFinished(Request, []int) bool { return false }

// HasPendingPushWork implements Scheduler.
func (Noop) HasPendingPushWork() bool { return false }

// ResetCache implements Scheduler: nothing to drop, always succeeds.
func (Noop) ResetCache(context.Context) (int, bool) { return 0, true }

// TakeEvents implements Scheduler.
func (Noop) TakeEvents() []Event { return nil }

// Stats implements Scheduler.
func (Noop) Stats() Stats { return nil }

// BindMetadata implements Worker.
func (Noop) BindMetadata(Metadata) {}

// HandlePreemptions implements Worker.
func (Noop) HandlePreemptions(context.Context) error { return nil }

// StartLoadKV implements Worker.
func (Noop) StartLoadKV(context.Context) error { return nil }

// WaitForSave implements Worker.
func (Noop) WaitForSave(context.Context) error { return nil }

// GetFinished implements Worker.
func (Noop) GetFinished([]string) (finishedSending, finishedRecving []string) { return nil, nil }

// BuildWorkerMeta implements Worker.
func (Noop) BuildWorkerMeta() Sealed { return Sealed{} }

// ClearMetadata implements Worker.
func (Noop) ClearMetadata() {}

// WaitIdle implements Worker.
func (Noop) WaitIdle(context.Context) error { return nil }
