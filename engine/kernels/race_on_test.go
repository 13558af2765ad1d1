//go:build race

package kernels

// raceEnabled: the race detector is on, and sync.Pool drops a share of what is Put on purpose,
// so tests of allocation counts do not apply.
const raceEnabled = true
