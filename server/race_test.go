//go:build race

package server_test

// The race detector slows the model about tenfold; long requests stay long enough to be
// caught in flight with fewer tokens.
const longTokens = 150

// loadTokens scales the generation lengths of the load test.
const loadTokens = 4
