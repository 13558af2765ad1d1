//go:build tools

// This file is never compiled (no build uses the "tools" tag). It exists because `go mod
// tidy` reads files under every build tag, so these blank imports keep the modules the
// design has chosen in go.mod until real code imports them. Delete a line once a package of
// the module imports that dependency.
package main

import (
	_ "github.com/redis/go-redis/v9" // the fleet control plane (next issues)
)
