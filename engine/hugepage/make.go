package hugepage

// Make returns a new zeroed slice of n elements advised for huge pages (Advise) before anything
// writes it: the allocation for a large buffer that is written once and then streamed, such as
// a weight tensor. On a KVM guest it also keeps a later read(2) into the buffer at memory speed:
// there the kernel's first write into a 4 KB page the process faulted in itself cost about
// 5 µs a page (a weight load into a user-written set ran at 0.6 GB/s instead of 1.5), while 2 MB
// pages, or pages the kernel wrote first, do not pay it.
func Make[T any](n int) []T {
	x := make([]T, n)
	Advise(x)
	return x
}
