//go:build tools

// This file is never compiled (no build uses the "tools" tag). It exists because `go mod
// tidy` reads files under every build tag, so these blank imports keep the modules the
// design has chosen in go.mod until real code imports them. Delete a line once a package of
// the module imports that dependency.
package main

import (
	_ "github.com/gin-gonic/gin"
	_ "github.com/nlpodyssey/safetensors"
	_ "github.com/openai/openai-go/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/spf13/cobra"
	_ "github.com/stretchr/testify/require"
	_ "github.com/x448/float16"
	_ "go.opentelemetry.io/otel"
	_ "go.uber.org/goleak"
	_ "pgregory.net/rapid"
)
