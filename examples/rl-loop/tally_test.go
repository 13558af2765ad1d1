package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A server's counter that drops is a restarted process: what the earlier
// process counted stays in the run's total, and a server that could not be
// scraped keeps its last figure.
func TestViolationTallySurvivesRestarts(t *testing.T) {
	v := newViolationTally(nil)
	v.record("a", 2)
	v.record("b", 0)
	require.EqualValues(t, 2, v.total())
	v.record("a", 3) // counted one more
	require.EqualValues(t, 3, v.total())
	v.record("a", 0) // restarted: its 3 stay
	require.EqualValues(t, 3, v.total())
	v.record("a", 1)
	v.record("b", 1)
	require.EqualValues(t, 5, v.total())
	// "b" not scraped this step: the total keeps its last figure.
	v.record("a", 1)
	require.EqualValues(t, 5, v.total())
}
