// Package hugepage asks Linux for transparent huge pages on the engine's large, streamed
// buffers: the packed weights, the KV pool, the read-bandwidth probe and the unpacked weight
// sets that loads decode into (Make; on a KVM guest 2 MB pages also spare a read(2) into
// user-written memory a cost per 4 KB page, see Make). Decode reads them in
// full every step; in 4 KB pages that is a TLB miss and a page-table walk every 4 KB (batch-1
// stories110m decoded about an eighth faster with huge pages on a Zen 5 EPYC), and under the
// common THP setting "madvise" no memory gets huge pages unless it is advised. The package
// imports nothing from the module, so the KV cache's plain data types may use it.
package hugepage
