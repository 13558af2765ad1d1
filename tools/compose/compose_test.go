package compose

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v4"
)

// root is the repository's top directory.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return dir
}

func load(t *testing.T) *types.Project {
	t.Helper()
	path := filepath.Join(root(t), "docker-compose.yml")
	opts, err := cli.NewProjectOptions([]string{path}, cli.WithWorkingDirectory(filepath.Dir(path)), cli.WithName("rollout"))
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "compose rejects docker-compose.yml")
	return p
}

// flag returns the value of --name in args ("--name value" or "--name=value").
func flag(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// The services that run the rollout image, and the uid it runs them as (the Dockerfile's).
var (
	servers     = []string{"rollout-1", "rollout-2"}
	rolloutSvcs = []string{"rollout-1", "rollout-2", "rl-loop"}
)

const rolloutUID = 10001

func TestComposeServices(t *testing.T) {
	p := load(t)
	want := []string{"init", "redis", "jaeger", "rollout-1", "rollout-2", "rl-loop", "prometheus", "grafana"}
	got := p.ServiceNames()
	for _, s := range want {
		require.Contains(t, got, s)
	}
	published := map[string][]string{}
	for _, name := range got {
		for _, port := range p.Services[name].Ports {
			published[name] = append(published[name], port.Published)
		}
	}
	require.Contains(t, published["jaeger"], "16686", "the Jaeger UI")
	require.Contains(t, published["grafana"], "3000")
	require.Contains(t, published["prometheus"], "9090")
	require.Contains(t, published["redis"], "6379")

	for _, name := range []string{"redis", "rollout-1", "rollout-2", "rl-loop", "prometheus", "grafana"} {
		hc := p.Services[name].HealthCheck
		require.NotNil(t, hc, "%s has no health check", name)
		require.NotEmpty(t, hc.Test, "%s", name)
	}
	for _, name := range servers {
		svc := p.Services[name]
		require.NotNil(t, svc.Build, "%s is built from the Dockerfile", name)
		require.Contains(t, svc.DependsOn, "redis")
		require.Equal(t, types.ServiceConditionHealthy, svc.DependsOn["redis"].Condition)
		cmd := []string(svc.Command)
		for _, f := range []string{"--redis", "--fleet", "--fleet-secret-file", "--otel", "--advertise-url"} {
			require.True(t, slices.Contains(cmd, f), "%s: command lacks %s: %v", name, f, cmd)
		}
		require.Equal(t, "http://jaeger:4318", *svc.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"])
	}
	loop := p.Services["rl-loop"]
	require.Equal(t, types.ServiceConditionHealthy, loop.DependsOn["rollout-1"].Condition)
	require.Equal(t, types.ServiceConditionHealthy, loop.DependsOn["rollout-2"].Condition)
}

// TestPortsOnLoopbackOnly: every published port is bound to 127.0.0.1, so nothing of the
// stack (Redis, the servers' admin and generation routes, the weight store, Jaeger,
// Prometheus, Grafana) is reachable from other hosts; and no service shares the host's
// network, which would publish everything it listens on.
func TestPortsOnLoopbackOnly(t *testing.T) {
	p := load(t)
	n := 0
	for name, svc := range p.Services {
		require.NotEqual(t, "host", svc.NetworkMode, "%s uses the host network", name)
		for _, port := range svc.Ports {
			n++
			require.Equal(t, "127.0.0.1", port.HostIP, "%s publishes %s:%d on every interface; write \"127.0.0.1:%s:%d\"",
				name, port.Published, port.Target, port.Published, port.Target)
		}
	}
	require.NotZero(t, n, "no published port checked")
}

// secretsMount is where svc mounts the generated secrets volume (read-only), or "".
func secretsMount(t *testing.T, name string, svc types.ServiceConfig) string {
	t.Helper()
	for _, v := range svc.Volumes {
		if v.Type == types.VolumeTypeVolume && v.Source == "secrets" {
			if name != "init" {
				require.True(t, v.ReadOnly, "%s mounts the secrets read-write", name)
			}
			return v.Target
		}
	}
	return ""
}

// TestNoCommittedSecrets: nothing in the repository works as a key. The files the stack once
// used as live keys (deploy/secrets/*) are neither tracked nor trackable, compose reads no
// secret from a file of the checkout, and no service gets a secret inline (in a flag, a URL or
// a variable), only as a file path.
func TestNoCommittedSecrets(t *testing.T) {
	dir := root(t)
	out, err := exec.Command("git", "-C", dir, "ls-files", "--", "deploy/secrets").CombinedOutput()
	require.NoError(t, err, "git ls-files: %s", out)
	require.Empty(t, strings.TrimSpace(string(out)), "deploy/secrets/ is tracked again")
	for _, f := range []string{"deploy/secrets/fleet_secret", "deploy/secrets/admin_token", "deploy/secrets/anything"} {
		require.NoError(t, exec.Command("git", "-C", dir, "check-ignore", "-q", f).Run(), "%s is not ignored by .gitignore", f)
	}

	p := load(t)
	for name, s := range p.Secrets {
		require.Empty(t, s.File, "secret %s is read from %s, a file of the checkout", name, s.File)
	}
	inline := regexp.MustCompile(`(?i)(PASSWORD|PASSWD|TOKEN|SECRET|API_?KEY|_AUTH$)`)
	for name, svc := range p.Services {
		for k, v := range svc.Environment {
			if inline.MatchString(k) {
				require.True(t, strings.HasSuffix(k, "__FILE") || strings.HasSuffix(k, "_FILE"),
					"%s: %s=%s puts a secret in the environment; use a file", name, k, deref(v))
			}
		}
		cmd := []string(svc.Command)
		for _, f := range []string{"--fleet-secret", "--admin-token", "--api-key", "--redis-password"} {
			_, ok := flag(cmd, f)
			require.False(t, ok, "%s: %s puts a secret on the command line; use %s-file", name, f, f)
		}
		if u, ok := flag(cmd, "--redis"); ok {
			require.NotRegexp(t, `://[^/@]*:[^/@]*@`, u, "%s: a password inside --redis", name)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "(unset)"
	}
	return *s
}

// generate runs deploy/init/secrets.sh into a new directory, as the init service does.
func generate(t *testing.T, dir string) map[string]string {
	t.Helper()
	out, err := exec.Command("sh", filepath.Join(root(t), "deploy", "init", "secrets.sh"), dir).CombinedOutput()
	require.NoError(t, err, "secrets.sh: %s", out)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	files := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		files[e.Name()] = string(b)
	}
	return files
}

// TestSecretsGenerated: the init service generates every secret the stack reads, before any
// service that reads one starts, fresh and random on the first run, the same on later runs,
// each readable by the one service user that needs it; and the file paths the services are
// given (flags, __FILE variables, health checks) all name generated files.
func TestSecretsGenerated(t *testing.T) {
	p := load(t)
	init := p.Services["init"]
	initTarget := secretsMount(t, "init", init)
	require.NotEmpty(t, initTarget, "init does not mount the secrets volume")
	require.Equal(t, []string{"sh", "/init/secrets.sh", initTarget, "/rl-run"}, []string(init.Command))
	// /rl-run is the loop's run volume, which init hands to the rollout user.
	runMounted := false
	for _, v := range init.Volumes {
		runMounted = runMounted || (v.Target == "/rl-run" && v.Source == "rl-run")
	}
	require.True(t, runMounted, "init does not mount rl-run at /rl-run")
	// Where the other services find them.
	target := secretsMount(t, "rl-loop", p.Services["rl-loop"])
	require.NotEmpty(t, target, "rl-loop does not mount the secrets volume")
	scriptMounted := false
	for _, v := range init.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == "/init/secrets.sh" {
			scriptMounted = v.Source == filepath.Join(root(t), "deploy", "init", "secrets.sh")
		}
	}
	require.True(t, scriptMounted, "init does not run the repository's deploy/init/secrets.sh")

	dir := filepath.Join(t.TempDir(), "secrets")
	first := generate(t, dir)
	hex64 := regexp.MustCompile(`^[0-9a-f]{64}$`)
	seen := map[string]string{}
	for _, name := range []string{"fleet_secret", "admin_token", "api_key", "redis_password", "grafana_admin_password"} {
		v, ok := first[name]
		require.True(t, ok, "%s not generated", name)
		require.Regexp(t, hex64, v, "%s: 32 random bytes in hex, no newline", name)
		require.NotContains(t, seen, v, "%s equals %s", name, seen[v])
		seen[v] = name
	}
	require.Equal(t, "requirepass "+first["redis_password"]+"\n", first["redis.conf"])
	require.Equal(t, first, generate(t, dir), "a second run must keep the secrets")
	other := generate(t, filepath.Join(t.TempDir(), "secrets"))
	require.NotEqual(t, first["fleet_secret"], other["fleet_secret"], "a fresh volume gets fresh secrets")

	// Who reads what: the uid each service's process runs as (its image's user).
	uid := map[string]int{"redis": 999, "grafana": 472}
	for _, name := range rolloutSvcs {
		uid[name] = rolloutUID
	}
	ref := regexp.MustCompile(regexp.QuoteMeta(target) + `/([A-Za-z0-9_.]+)`)
	reads := map[string][]string{}
	for name, svc := range p.Services {
		mount := secretsMount(t, name, svc)
		if name == "init" {
			continue
		}
		var text []string
		text = append(text, svc.Command...)
		for _, v := range svc.Environment {
			if v != nil {
				text = append(text, *v)
			}
		}
		for _, s := range ref.FindAllStringSubmatch(strings.Join(text, " "), -1) {
			reads[name] = append(reads[name], s[1])
		}
		if mount == "" {
			require.Empty(t, reads[name], "%s reads secrets it does not mount", name)
			continue
		}
		require.Equal(t, target, mount, "%s mounts the secrets elsewhere", name)
		require.Contains(t, svc.DependsOn, "init", "%s may start before its secrets exist", name)
		require.Equal(t, types.ServiceConditionCompletedSuccessfully, svc.DependsOn["init"].Condition, "%s", name)
		require.NotEmpty(t, reads[name], "%s mounts the secrets and reads none", name)
		for _, f := range reads[name] {
			require.Contains(t, first, f, "%s reads %s/%s, which init does not generate", name, target, f)
		}
		if svc.HealthCheck != nil {
			for _, s := range ref.FindAllStringSubmatch(strings.Join(svc.HealthCheck.Test, " "), -1) {
				require.Contains(t, first, s[1], "%s's health check reads %s, which init does not generate", name, s[1])
			}
		}
	}
	for _, name := range servers {
		for _, f := range []string{"--fleet-secret-file", "--admin-token-file", "--api-key-file", "--redis-password-file"} {
			v, ok := flag(p.Services[name].Command, f)
			require.True(t, ok, "%s lacks %s", name, f)
			require.True(t, strings.HasPrefix(v, target+"/"), "%s %s %s is not a generated secret", name, f, v)
		}
	}
	for _, f := range []string{"--fleet-secret-file", "--api-key-file", "--redis-password-file"} {
		_, ok := flag(p.Services["rl-loop"].Command, f)
		require.True(t, ok, "rl-loop lacks %s", f)
	}
	require.Equal(t, []string{"redis-server", target + "/redis.conf"}, []string(p.Services["redis"].Command[:2]),
		"redis-server must load the generated requirepass")
	require.Contains(t, strings.Join(p.Services["redis"].HealthCheck.Test, " "), "REDISCLI_AUTH", "the health check must authenticate")

	graf := p.Services["grafana"].Environment
	require.NotContains(t, graf, "GF_SECURITY_ADMIN_PASSWORD", "Grafana's admin password inline")
	require.NotNil(t, graf["GF_SECURITY_ADMIN_PASSWORD__FILE"], "Grafana would start with its default admin password")
	require.Equal(t, target+"/grafana_admin_password", *graf["GF_SECURITY_ADMIN_PASSWORD__FILE"])

	// Each file is mode 0400 and owned by the one user that reads it. Ownership is only set
	// when the script runs as root, as the init service does.
	for name, files := range reads {
		for _, f := range files {
			st, err := os.Stat(filepath.Join(dir, f))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o400), st.Mode().Perm(), "%s", f)
			if os.Geteuid() == 0 {
				require.EqualValues(t, uid[name], st.Sys().(*syscall.Stat_t).Uid, "%s reads %s but cannot", name, f)
			}
		}
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the files' owners were not checked")
	}
}

// TestNoPrivateAddressOptIn: no server may fetch weights from private or link-local addresses
// (cloud metadata services among them). The loop publishes file:// refs in its run volume,
// which the servers mount read-only and confine their file sources to with --weights-root.
func TestNoPrivateAddressOptIn(t *testing.T) {
	p := load(t)
	for name, svc := range p.Services {
		for k := range svc.Environment {
			require.NotContains(t, strings.ToUpper(k), "ALLOW_PRIVATE", "%s: %s", name, k)
		}
		for _, a := range svc.Command {
			require.NotContains(t, a, "allow-private", "%s: %s", name, a)
			require.NotContains(t, a, "allow-unverified", "%s: %s", name, a)
		}
	}
	loop := p.Services["rl-loop"]
	storeURL, ok := flag(loop.Command, "--store-url")
	require.True(t, ok)
	storeDir, ok := strings.CutPrefix(storeURL, "file://")
	require.True(t, ok, "the loop's refs must be file:// (got %s): an http ref on the compose network is a private address", storeURL)
	out, ok := flag(loop.Command, "--out")
	require.True(t, ok)
	require.Equal(t, filepath.Join(out, "weights"), storeDir, "the loop writes its store to --out/weights")
	var runVolume string
	for _, v := range loop.Volumes {
		if v.Target == out {
			runVolume = v.Source
			require.False(t, v.ReadOnly)
		}
	}
	require.NotEmpty(t, runVolume, "the loop's --out is not a volume")
	for _, name := range servers {
		svc := p.Services[name]
		root, ok := flag(svc.Command, "--weights-root")
		require.True(t, ok, "%s takes file sources from anywhere", name)
		require.Equal(t, storeDir, root, "%s", name)
		mounted := false
		for _, v := range svc.Volumes {
			if v.Source == runVolume && v.Target == out {
				mounted = true
				require.True(t, v.ReadOnly, "%s mounts the loop's run read-write", name)
			}
		}
		require.True(t, mounted, "%s does not see the loop's store at %s", name, out)
	}
}

// TestKeepsRunning: the stack keeps working until it is stopped. Every long-running service
// restarts; the loop resumes from its checkpoint on every restart (a fresh trainer at version
// 0 would meet a fleet at version N and fail at once) and ends its runs, so it plots.
func TestKeepsRunning(t *testing.T) {
	p := load(t)
	for name, svc := range p.Services {
		if name == "init" {
			require.Empty(t, svc.Restart, "init is one-shot")
			continue
		}
		require.Contains(t, []string{"unless-stopped", "always"}, svc.Restart, "%s does not restart", name)
	}
	cmd := []string(p.Services["rl-loop"].Command)
	require.True(t, slices.Contains(cmd, "--resume"), "rl-loop: %v", cmd)
	// A server restarted mid-update loses its stage command; under policy all the loop would
	// wait out the stage timeout and exit (TestComposeSoak found it).
	policy, ok := flag(cmd, "--policy")
	require.True(t, ok && strings.HasPrefix(policy, "quorum:"), "rl-loop --policy %q: a restarting server would hold the loop", policy)
	steps, ok := flag(cmd, "--steps")
	require.True(t, ok)
	n, err := strconv.Atoi(steps)
	require.NoError(t, err)
	require.Positive(t, n)
}

// TestExemplars: the trace ids the servers attach to their histograms reach Grafana as links to
// Jaeger. Prometheus negotiates OpenMetrics (the only format that carries exemplars) and
// stores them; Grafana's Prometheus data source maps the exemplar label to the provisioned
// Jaeger data source; the dashboard's panels of those histograms ask for exemplars. The
// Prometheus configuration is loaded with Prometheus's own loader.
func TestExemplars(t *testing.T) {
	dir := root(t)
	p := load(t)
	prom := p.Services["prometheus"]
	features := ""
	for _, a := range prom.Command {
		if v, ok := strings.CutPrefix(a, "--enable-feature="); ok {
			features += "," + v
		}
	}
	require.Contains(t, strings.Split(features, ","), "exemplar-storage", "prometheus: %v", prom.Command)
	cfgPath := ""
	for _, v := range prom.Volumes {
		if v.Target == "/etc/prometheus/prometheus.yml" {
			cfgPath = v.Source
		}
	}
	require.Equal(t, filepath.Join(dir, "deploy", "prometheus", "prometheus.yml"), cfgPath)
	pc, err := promconfig.LoadFile(cfgPath, false, nil)
	require.NoError(t, err)
	var targets []string
	for _, sc := range pc.ScrapeConfigs {
		require.NotEmpty(t, sc.ScrapeProtocols)
		require.Contains(t, []promconfig.ScrapeProtocol{promconfig.OpenMetricsText1_0_0, promconfig.OpenMetricsText0_0_1}, sc.ScrapeProtocols[0],
			"job %s does not ask for OpenMetrics first: no exemplars", sc.JobName)
		for _, c := range sc.ServiceDiscoveryConfigs {
			if groups, ok := c.(discovery.StaticConfig); ok {
				for _, g := range groups {
					for _, tg := range g.Targets {
						targets = append(targets, string(tg[model.AddressLabel]))
					}
				}
			}
		}
	}
	for _, name := range servers {
		require.Contains(t, targets, name+":8000", "Prometheus does not scrape %s", name)
	}

	// The exemplar label the servers write.
	src, err := os.ReadFile(filepath.Join(dir, "server", "api", "metrics.go"))
	require.NoError(t, err)
	require.Contains(t, string(src), `"trace_id":`, "the servers' exemplar label changed: update the Grafana data source")

	var ds struct {
		Datasources []struct {
			Name, UID, Type, URL string
			JSONData             struct {
				Exemplars []struct {
					Name          string `yaml:"name"`
					DatasourceUID string `yaml:"datasourceUid"`
				} `yaml:"exemplarTraceIdDestinations"`
			} `yaml:"jsonData"`
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "deploy", "grafana", "provisioning", "datasources", "prometheus.yml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &ds))
	byUID := map[string]string{}
	for _, d := range ds.Datasources {
		byUID[d.UID] = d.Type
		if d.Type == "jaeger" {
			require.Equal(t, "http://jaeger:16686", d.URL)
		}
	}
	linked := false
	for _, d := range ds.Datasources {
		if d.Type != "prometheus" {
			continue
		}
		require.Equal(t, "http://prometheus:9090", d.URL)
		for _, e := range d.JSONData.Exemplars {
			require.Equal(t, "trace_id", e.Name)
			require.Equal(t, "jaeger", byUID[e.DatasourceUID], "exemplars link to %q, not a provisioned Jaeger data source", e.DatasourceUID)
			linked = true
		}
	}
	require.True(t, linked, "no exemplarTraceIdDestinations on the Prometheus data source")
	require.Contains(t, p.Services["grafana"].DependsOn, "jaeger")

	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct {
				Expr     string
				Exemplar bool
			}
		}
	}
	b, err = os.ReadFile(filepath.Join(dir, "deploy", "grafana", "dashboards", "rollout.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &dash))
	n := 0
	for _, panel := range dash.Panels {
		for _, tg := range panel.Targets {
			if strings.Contains(tg.Expr, "rollout_update_weights_seconds") || strings.Contains(tg.Expr, "rollout_reset_to_flush_seconds") {
				n++
				require.True(t, tg.Exemplar, "panel %q does not show its exemplars", panel.Title)
			}
		}
	}
	require.NotZero(t, n, "no panel of an exemplar-carrying histogram")
}

// TestImage: the image builds the default (assembly) kernels, starts with its default command
// and gets a small build context.
func TestImage(t *testing.T) {
	dir := root(t)
	b, err := os.ReadFile(filepath.Join(dir, "Dockerfile"))
	require.NoError(t, err)
	var cmd string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		require.NotRegexp(t, `GOEXPERIMENT=\S*simd`, line, "the default build must not select the archsimd kernels")
		if c, ok := strings.CutPrefix(line, "CMD "); ok {
			cmd = c
		}
		if u, ok := strings.CutPrefix(line, "RUN adduser"); ok {
			require.Contains(t, u, "-u "+strconv.Itoa(rolloutUID), "compose's secrets are owned by uid %d", rolloutUID)
		}
	}
	var args []string
	require.NoError(t, json.Unmarshal([]byte(cmd), &args), "CMD %s", cmd)
	// serve refuses tokenless admin routes on a non-loopback listener: the default command
	// needs a token file or the admin routes on loopback.
	admin, ok := flag(args, "--admin-addr")
	_, token := flag(args, "--admin-token-file")
	require.True(t, token || (ok && (strings.HasPrefix(admin, "127.0.0.1:") || strings.HasPrefix(admin, "unix:"))),
		"the default command would be refused: %v", args)

	b, err = os.ReadFile(filepath.Join(dir, ".dockerignore"))
	require.NoError(t, err)
	var ignored []string
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			ignored = append(ignored, strings.Trim(line, "/"))
		}
	}
	for _, p := range []string{"bin", ".git", "rl-loop-out", "deploy/secrets"} {
		require.Contains(t, ignored, p, ".dockerignore")
	}
	for _, p := range []string{"go.mod", "go.sum", "cmd", "examples", "engine", "*", "**"} {
		require.NotContains(t, ignored, p, ".dockerignore leaves the build without %s", p)
	}
}
