// Package cpu is the CPU tier of the offloading connector: the slot manager that decides which
// chunk of KV lives in which CPU slot (vLLM's CPUOffloadingManager) with LRU and ARC eviction policies.
//
// The manager is a pure state machine driven from the connector's scheduler side: it never
// touches bytes. Slot ids are handed out fresh (0, 1, 2, ...) first and then LIFO from a free list;
// a key is readable (Hit) only after CompleteStore; a key that is being written (ref count -1) or
// pinned by loads (ref count > 0) is never evicted; PrepareStore never evicts a key of its own
// input; a failed eviction changes nothing.
//
// Every allocation carries a generation number, unique for the manager's lifetime (resets
// included), so the worker side can tell the content of a slot it was asked to read from whatever
// a later owner wrote there.
package cpu
