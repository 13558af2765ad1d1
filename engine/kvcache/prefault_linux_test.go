package kvcache

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPrefaultCommitsEveryPage writes every page of a prefaulted pool and counts the page
// faults that took: after Prefault there are (almost) none left to take, where a fresh pool
// would fault once per page.
func TestPrefaultCommitsEveryPage(t *testing.T) {
	s, err := NewStorage(Layout{NumLayers: 4, NumBlocks: 257, BlockSize: 16, KVDim: 256}) // 32 MiB
	require.NoError(t, err)
	s.Prefault(2)
	page := os.Getpagesize() / 4
	pages := len(s.data) / page
	for i, v := range s.data {
		if v != 0 {
			t.Fatalf("float %d is %v after Prefault, want 0", i, v)
		}
	}
	before := minorFaults(t)
	for i := 0; i < len(s.data); i += page {
		s.data[i] = 1
	}
	faults := minorFaults(t) - before
	require.Less(t, faults, int64(pages/10), "%d of %d pages faulted after Prefault", faults, pages)
}

func minorFaults(t *testing.T) int64 {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return ru.Minflt
}
