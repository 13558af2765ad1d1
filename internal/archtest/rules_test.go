package archtest

const modulePath = "github.com/rolloutkit/rollout"

// m turns a module-relative pattern ("engine/...") into a full import-path pattern.
func m(rel string) string { return modulePath + "/" + rel }

// External packages a layer may have to keep out, as import-path patterns.
const (
	ginPkgs     = "github.com/gin-gonic/gin/..."
	cobraPkgs   = "github.com/spf13/cobra/..."
	redisPkgs   = "github.com/redis/go-redis/..."
	otelSDKPkgs = "go.opentelemetry.io/otel/sdk/..." // the SDK; the API (otel, otel/trace, ...) is fine
)

// plainDataPackages are module packages that offload may import besides engine/kvconnector:
// "plain data types" in docs/architecture.md's words, and the leaf they use (engine/hugepage).
// Each may import from the module only other packages of this list, which the "plain-data" rule
// checks, so adding one here cannot smuggle in a dependency.
var plainDataPackages = []string{m("engine/kvcache"), m("engine/hugepage")}

// designRules are the dependency rules of docs/architecture.md. Patterns are import paths; a trailing "/..."
// matches the package and everything below it.
func designRules() []rule {
	return []rule{
		{
			Name: "engine-isolation",
			Why:  "the engine is a library: it knows nothing of offload, server, fleet, trainer or CLI, nor their frameworks",
			From: []string{m("engine/...")},
			Forbid: []string{
				m("offload/..."), m("server/..."), m("sdk/..."), m("trainer/..."), m("cmd/..."), m("examples/..."),
				ginPkgs, cobraPkgs, redisPkgs, otelSDKPkgs,
			},
		},
		{
			Name:        "offload-imports",
			Why:         "offload plugs into the engine only through engine/kvconnector (and plain data types)",
			From:        []string{m("offload/...")},
			AllowModule: append([]string{m("offload/..."), m("engine/kvconnector")}, plainDataPackages...),
			Forbid: []string{
				// Reached through kvconnector or a plain-data package, these would still be wrong.
				m("engine"), m("engine/sched/..."), m("engine/model/..."),
				m("server/..."), m("sdk/..."), m("trainer/..."), m("cmd/..."), m("examples/..."),
				ginPkgs, cobraPkgs, redisPkgs, otelSDKPkgs,
			},
		},
		{
			Name: "plain-data",
			Why:  "a plain data package offload may import must not depend on the rest of the module",
			From: plainDataPackages,
			// Each package of the list is under this rule too, so it holds transitively.
			AllowModule: plainDataPackages,
		},
		{
			Name:   "sdk-isolation",
			Why:    "the SDK is imported by training code: it must not drag in the engine, the server or their frameworks",
			From:   []string{m("sdk/...")},
			Forbid: []string{m("engine/..."), m("server/..."), m("cmd/..."), ginPkgs, cobraPkgs},
		},
		{
			Name:   "telemetry-in-mains",
			Why:    "sdk/telemetry installs OTel globals; only main packages may do that",
			From:   []string{m("...")},
			Except: []string{m("cmd/..."), m("examples/..."), m("sdk/telemetry/...")},
			Forbid: []string{m("sdk/telemetry/...")},
		},
		{
			Name:   "otel-sdk-at-edges",
			Why:    "libraries take a trace.TracerProvider; only mains, sdk/telemetry and the server build one",
			From:   []string{m("...")},
			Except: []string{m("cmd/..."), m("examples/..."), m("sdk/telemetry/..."), m("server/...")},
			Forbid: []string{otelSDKPkgs},
		},
	}
}
