package api

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"
)

var quietGinOnce sync.Once

// quietGin keeps gin's debug output (a warning per router and a line per route while gin is
// in its default debug mode) off the importer's stdout: a library must print nothing there.
// gin offers no per-router switch, only its process-wide print hooks, so this sets them once,
// and only when the process made no choice of its own: no GIN_MODE in the environment and no
// hook installed. The lines then go to slog.Default() at debug level. A process that set gin's
// mode or hooks (as the rollout command does) keeps its choice.
func quietGin() {
	quietGinOnce.Do(func() {
		if !gin.IsDebugging() || os.Getenv(gin.EnvGinMode) != "" || gin.DebugPrintFunc != nil || gin.DebugPrintRouteFunc != nil {
			return
		}
		gin.DebugPrintFunc = func(format string, values ...any) {
			slog.Default().Log(context.Background(), slog.LevelDebug, "gin: "+strings.TrimSpace(fmt.Sprintf(format, values...)))
		}
		gin.DebugPrintRouteFunc = func(method, path, handler string, handlers int) {
			slog.Default().Log(context.Background(), slog.LevelDebug, "gin: route", "method", method, "path", path, "handler", handler, "handlers", handlers)
		}
	})
}
