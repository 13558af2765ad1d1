// Package hugepage asks Linux for transparent huge pages on the engine's large, streamed
// buffers: the packed weights, the KV pool and the read-bandwidth probe. Decode reads them in
// full every step; in 4 KB pages that is a TLB miss and a page-table walk every 4 KB (batch-1
// stories110m decoded about an eighth faster with huge pages on a Zen 5 EPYC), and under the
// common THP setting "madvise" no memory gets huge pages unless it is advised. The package
// imports nothing from the module, so the KV cache's plain data types may use it.
package hugepage
