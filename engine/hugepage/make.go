package hugepage

// Make returns a new zeroed slice of n elements advised for huge pages (Advise) before anything
// writes it: the allocation for a large buffer that is written once and then streamed, such as
// a weight set. On a KVM guest it also keeps a read(2) into the buffer at memory speed: there
// the first kernel write into a 4 KB page that user code faulted in (and the first user access
// to one the kernel filled) cost about 5 µs, once per page, so a weight load into a preset's
// memory ran at 0.6 GB/s instead of 1.6; 2 MB pages do not pay it.
func Make[T any](n int) []T {
	x := make([]T, n)
	Advise(x)
	return x
}
