// Package offload is the KV offloading connector: it copies KV blocks from the engine's pool to
// CPU slots and loads them back for prefix hits the pool no longer holds (vLLM's
// v1 OffloadingConnector; docs/reset.md explains the bug), with the reset bug fixed and with
// memory-safety checks that stay on in production.
//
// The scheduler side (Connector.Scheduler) is a deterministic state machine called from the
// engine goroutine: chunk keys from block hashes, one store job per newly complete chunk run,
// loads for hits beyond the engine's prefix cache, one job id counter shared by loads and stores,
// a fence index so a store whose source block is reallocated is flushed before the new owner's
// forward pass, a stale-job threshold after a reset, and ResetCache with the fixed semantics:
//
//   - HasPendingPushWork is true while jobs are tracked, a flush set is not yet delivered, or a
//     finished request still waits for its delayed free, so a reset on an otherwise idle engine
//     makes it take one more (0-token) step that hands the flush set to the workers;
//   - ResetCache is re-entrant: a second reset before the next step unions its job ids into the
//     pending set; the next step's Metadata.FlushJobIDs carries the union exactly once.
//
// The worker side (Connector.Worker) copies real bytes between the KV pool and a CPU buffer on
// goroutines, FIFO per direction. Stores built at step N are submitted at the start of step N+1;
// HandlePreemptions submits them and waits on the step's flush set before anything can write KV.
// A transfer of Config.SplitBytes or more shares its blocks with Config.CopyThreads-1 helper
// goroutines (one copy thread alone is about a third of what the memory can move); each
// block's checksum parts are computed on their own and folded in order, so the checksum, the
// per-chunk checks and the transfer's completion are those of the one-goroutine copy.
//
// # Safety checks
//
// Each transfer records the generation of every pool block (kvcache.Manager.Generation) and CPU
// slot it touches when the scheduler side creates it, and the worker checks them before and after
// each copy; stored chunks get a CRC-32C that loads verify. A mismatch on anything a transfer
// writes (a load's destination blocks, a store's destination slot), on a slot a load reads, or on
// a checksum is a violation: counted in safety_violations_total, logged with the job id, and
// fatal to tests; a load that fails a check is also reported to the scheduler as failed (its
// request frees the blocks and recomputes) and its keys leave the CPU tier. A store whose source
// block was freed before or during the copy (its request was
// preempted) is not a violation, because nothing it wrote is ever used: its result is discarded
// (offload_stores_discarded_total) and the key never becomes readable.
//
// Unlike vLLM, RequestFinished delays the free of a request's blocks while its stores are in
// flight (the pool bumps a block's generation on every free, so a store reading a freed block
// could never be proven safe); the scheduler side releases them through the worker's
// FinishedSending once the last store completed.
//
// # Stats
//
// Stats keys (the server maps each to rollout_<key>): offload_jobs_inflight,
// offload_flush_pending, offload_transfers_inflight (copies submitted to the worker and not
// finished), offload_flush_delivered_total, offload_resets_total,
// offload_resets_merged_total, offload_stored_bytes_total, offload_loaded_bytes_total,
// offload_hit_tokens_total, offload_stores_discarded_total, offload_alloc_failures_total,
// offload_lookup_misses_total, offload_stale_completions_total,
// offload_unknown_completions_total, offload_duplicate_completes_total,
// offload_load_failures_total (loads that failed a check: their requests recomputed and the
// keys were dropped), offload_checksum_failures_total (chunks whose loaded bytes failed their
// checksum; each is also a safety violation), offload_cpu_slots,
// offload_cpu_slots_used, safety_violations_total.
package offload
