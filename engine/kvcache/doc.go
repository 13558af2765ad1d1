// Package kvcache holds the paged KV cache: the "device" storage (Storage), the block pool with
// ref counts, an LRU free queue and prefix caching by chained block hash (Manager), and the hash
// function (HashBlock, ExtendHashes).
//
// The Manager follows vLLM v1's BlockPool/KVCacheManager:
//
//   - Block 0 is the null block: never allocated, freed or cached.
//   - Blocks with ref count 0 sit in a doubly linked free queue. Allocation pops from the front and
//     evicts the popped block's cached hash. Free walks a request's blocks in reverse and appends
//     cached blocks at the back (so a request's tail blocks are evicted before its head) and puts
//     uncached blocks at the front (reused first). A cached block with ref count 0 stays in the
//     queue and a prefix hit revives it.
//   - A block hash chains the parent's hash with the block's token ids; the first block's hash also
//     covers the weight version and the request's cache salt, so KV computed under one weight
//     version is never matched under another, whether or not a reset happened in between.
//   - Only full blocks whose KV has been written are cached (CacheBlocks). This is later than
//     vLLM, which caches at allocation time; it means a block can never be hit by a request
//     scheduled in the same step as the forward pass that fills it.
//   - Every block has a generation number that changes when it is freed, reallocated or reset,
//     readable from any goroutine, so KV transfers can detect reuse instead of assuming it away.
//
// The Manager is a pure state machine (no goroutines, clocks or randomness); the scheduler owns it.
package kvcache
