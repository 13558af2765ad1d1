//go:build !race

package server_test

// loadTokens scales the generation lengths of the load test.
const loadTokens = 1
