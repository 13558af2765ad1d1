// Package archtest enforces the dependency rules of docs/architecture.md ("Packages and the
// rules between them") as a test: `go test ./internal/archtest/` lists every package of the module with
// `go list -deps -json` (in both GOEXPERIMENT modes, since build tags can change imports) and
// fails, naming the import chain, when a package reaches something its layer must not.
//
// The rules live in rules_test.go, and the layer table (every package in one layer, each
// layer importing only the layers it lists) is read from docs/architecture.md by layers_test.go. A rule whose packages do not exist yet matches nothing and
// passes; it starts biting the moment such a package is created. Only non-test imports are
// checked: a test may wire layers together that production code must keep apart.
//
// The package has no non-test code.
package archtest
