//go:build !race

package server_test

// longTokens is the length of requests that must still be running when an admin call lands.
const longTokens = 1800

// loadTokens scales the generation lengths of the load test.
const loadTokens = 1
