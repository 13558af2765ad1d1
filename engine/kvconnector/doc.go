// Package kvconnector defines the interfaces between the engine and a KV connector (an external
// KV tier such as the CPU offloading connector in package offload), after vLLM's
// KVConnectorBase_V1, and the per-step Metadata that links the connector's two sides.
//
// The scheduler side (Scheduler) lives inside the engine's scheduler and is called from its one
// goroutine; the worker side (Worker) is driven by the model runner around the forward pass. The
// two sides talk only through the step:
//
//	so, err := sched.Schedule()         // calls Scheduler.BuildConnectorMeta exactly once, even
//	                                    // for a 0-token step; so carries the Metadata
//	out, err := kvconnector.RunStep(ctx, worker, so.ConnectorMeta, so.FinishedReqIDs, forward)
//	                                    // Bind, HandlePreemptions (flush), StartLoadKV, forward,
//	                                    // WaitForSave, GetFinished, BuildWorkerMeta, Clear
//	outs, err := sched.UpdateFromOutput(so, mo) // mo.KVConnector = out -> Scheduler.UpdateConnectorOutput
//
// Metadata reaches the worker side only inside a step and every step carries one. Because of that
// a connector with something still to deliver (a flush set left by ResetCache, in-flight jobs)
// must report HasPendingPushWork, which keeps the engine stepping until it is delivered.
//
// A step that fails (a phase of RunStep returns an error) still reports its finished transfers
// and worker metadata, so no completion is lost; a worker implementing StepFailer fails the
// transfers built for the KV the step did not compute, and the engine's scheduler rolls the
// step's requests back (sched.Scheduler.FailStep). A load that completes without valid KV is
// reported in Output.FailedRecving (LoadErrorReporter): the scheduler frees its blocks and the
// request recomputes.
//
// A connector's own per-step data (the loads and stores its worker side runs, the completions
// it reports back) travels sealed (Sealed) through the scheduler and the engine, which never
// read it. The connector implements TypedScheduler[P, W] and TypedWorker[P, W] with its payload
// types and joins them with Bind: a worker side expecting another payload than its scheduler
// side builds is a compile error, and metadata reaching the worker side of another connector
// fails the step (ErrForeignMetadata) instead of arriving as a zero payload.
//
// Everything else crossing the boundary is plain data (request ids, block ids, block hashes), so a
// connector needs to import only this package.
package kvconnector
