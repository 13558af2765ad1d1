// Package lint pins golangci-lint in a module of its own: `make lint-golangci` builds it from
// here into bin/. Its dependencies would otherwise raise the versions Jaeger (in the parent
// tools module) needs, or land in the main module's go.sum that SDK importers inherit.
package lint
