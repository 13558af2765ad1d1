// Package enginetest starts real engines for the tests of the packages built on the engine
// (the HTTP API, the fleet agent): one place for the start-run-stop dance each would repeat.
package enginetest
