// Package importtest checks what a program that imports this module inherits: its test builds a
// throwaway module that imports sdk and server/embedded (through a replace directive pointing at
// this checkout), runs `go mod tidy` and `go build` there, and fails when the throwaway module's
// go.sum grows past a ceiling close to what those packages really need. A development tool or a
// test-only dependency that slips into the packages importers use shows up here as a longer go.sum.
//
// The package has no non-test code.
package importtest
