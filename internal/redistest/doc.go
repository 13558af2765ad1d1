// Package redistest runs real redis-server processes for tests, and a TCP proxy between a
// client and one of them that a test can partition and heal.
//
// Start skips the test (with a message saying so) when redis-server is not on PATH, so run
// tests on a machine that has it: CI installs it. Every server listens on 127.0.0.1 on a
// free port, keeps nothing on disk, and is killed when the test ends.
package redistest
