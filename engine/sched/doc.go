// Package sched is the engine's scheduler: vLLM v1's Scheduler as a pure, deterministic state
// machine (no goroutines, clocks or randomness), in the spirit of etcd raft's RawNode. The engine
// core's single goroutine drives it and does all I/O (model forward, connector transfers, client
// streams) around it.
//
// # The call loop
//
//	pool, _ := kvcache.New(kvcache.Config{NumBlocks: n, BlockSize: 16, PrefixCaching: true})
//	s, _ := sched.New(sched.Config{...}, pool, connector) // connector nil: kvconnector.Noop
//	for {
//		// 1. Handle every queued message first: s.Add(req), s.Abort(ids...),
//		//    s.SetPauseState(p), s.ResetPrefixCache(ctx, r, c), s.SetWeightVersion(v), ...
//		//    Abort/FinishRequests return the final outputs to send to clients.
//		// 2. Block on the input queue while there is nothing to do:
//		if !s.HasRequests() { wait for a message; continue }
//		// 3. One step. A step may have 0 tokens; run it anyway: it delivers the connector
//		//    metadata (e.g. a reset's flush set) and the finished/preempted ids.
//		so, err := s.Schedule()
//		// runner: drop state for so.PreemptedReqIDs and so.FinishedReqIDs; then for each
//		// so.Scheduled[i] write KV for TokenIDs at StartPos.. into BlockIDs and, when Sample is
//		// set, sample one token; around the forward drive the connector's worker side with
//		// kvconnector.RunStep(ctx, worker, so.ConnectorMeta, so.FinishedReqIDs, forward).
//		mo := &sched.ModelOutput{Step: so.Step, Sampled: ..., KVConnector: out}
//		outs, err := s.UpdateFromOutput(so, mo) // tokens, finishes -> client streams
//	}
//
// Schedule and UpdateFromOutput alternate strictly (ErrStepPending, ErrOutputMismatch
// otherwise). Messages may be handled between them: an abort or a reset that preempts
// requests makes UpdateFromOutput ignore the stale results of those requests.
//
// # Semantics
//
// Requests are served first come, first served with continuous batching: each step first
// advances the running requests (a decode is 1 token, a prefill is chunked to the remaining
// MaxNumBatchedTokens budget), preempting the last running request when blocks run out
// (preemption by recompute: its KV is freed and it goes back to the front of the waiting queue);
// then, if nothing was preempted and the scheduler is Unpaused, admits waiting requests while
// budget, MaxNumSeqs and blocks allow, after a prefix-cache lookup (and a connector lookup).
// PausedNew stops admissions; PausedAll schedules nothing. A request finishes on max tokens or
// the context length (FinishLength), EOS or a stop token (FinishStop, after MinTokens), or abort.
//
// The weight version is an input (SetWeightVersion). A request's block hashes use the version
// current when it starts computing from scratch (admission or resume after preemption), so KV
// computed under one version is never matched by a lookup under another.
//
// Blocks are added to the prefix cache in UpdateFromOutput, once the step that fills them has run
// (vLLM caches them at allocation), so no request can hit KV that is still being computed.
//
// With a connector: a request granted an asynchronous load waits (StatusWaitingForRemoteKVs)
// holding its blocks until its id is in FinishedRecving; loaded requests are admitted before the
// rest of the waiting queue, and when nothing runs they give up their blocks (preemption) rather
// than deadlock with the queue head. A load that lands after a weight-version change is dropped
// and the request recomputes. Aborting a loading request delays its block free until the load
// lands; RequestFinished returning true delays it until FinishedSending. A load reported in
// FailedRecving (no valid KV) frees its blocks and the request recomputes. A step whose execution
// failed is closed with FailStep before UpdateFromOutput: its requests are rolled back to the
// step's start and finished, so nothing the step was to compute is cached.
//
// ResetPrefixCache never reports a success it did not achieve: it returns what it cleared and why
// it could not clear the rest; blocks still in use after it (a load in flight, a free the
// connector delays) make it fail even when forced. With resetRunning, requests whose load landed
// recompute too, and a load in flight is dropped when it lands. DropAllKV is for a caller about
// to release the KV memory itself (the engine's sleep): afterwards no request owns a block.
package sched
