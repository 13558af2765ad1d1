package redisconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Errors callers branch on. Every configuration error wraps ErrInvalid and one of the others.
var (
	// ErrInvalid wraps every configuration Resolve refuses: retrying will not help.
	ErrInvalid = errors.New("redis config: invalid")
	// ErrScheme is an empty or unknown URL scheme.
	ErrScheme = errors.New("unknown scheme")
	// ErrURL is a URL that does not parse or has a bad address, path or option.
	ErrURL = errors.New("bad URL")
	// ErrNoMaster is a Sentinel URL without a master name.
	ErrNoMaster = errors.New("no sentinel master name")
	// ErrTLSFiles is a CA, certificate or key file that cannot be read or parsed, or TLS
	// files given for a URL that is not rediss.
	ErrTLSFiles = errors.New("bad TLS files")
	// ErrSecretFile is a password file that cannot be read or is empty.
	ErrSecretFile = errors.New("bad password file")
	// ErrConflict is two settings that say different things (a password in the URL and a
	// password file, a sentinel URL and a cluster, ...).
	ErrConflict = errors.New("conflicting settings")
)

// Environment variables LoadEnv reads.
const (
	// EnvPassword holds the data nodes' password.
	EnvPassword = "ROLLOUT_REDIS_PASSWORD"
	// EnvRedisCLIAuth is redis-cli's password variable, read when EnvPassword is unset.
	EnvRedisCLIAuth = "REDISCLI_AUTH"
	// EnvSentinelPassword holds the sentinels' password.
	EnvSentinelPassword = "ROLLOUT_REDIS_SENTINEL_PASSWORD"
)

// Default ports of an address without one.
const (
	DefaultPort         = "6379"
	DefaultSentinelPort = "26379"
)

// Mode is the kind of deployment a configuration reaches.
type Mode int

// Deployment kinds.
const (
	// Single is one Redis server (or a proxy in front of several).
	Single Mode = iota
	// Sentinel is a primary found through Redis Sentinel, followed across failovers.
	Sentinel
	// Cluster is a Redis Cluster: keys and sharded channels are spread over its primaries.
	Cluster
)

// String names the mode: single, sentinel or cluster.
func (m Mode) String() string {
	switch m {
	case Sentinel:
		return "sentinel"
	case Cluster:
		return "cluster"
	default:
		return "single"
	}
}

// Config says how to reach the fleet's Redis. URL is required; everything else is optional.
type Config struct {
	// URL is the deployment (see the package doc for the forms).
	URL string
	// Username is the ACL user, when the URL has none.
	Username string
	// Password is the data nodes' password, when the URL has none (e.g. read from the
	// environment). PasswordFile names a file holding it (trailing newline ignored). At most
	// one of the URL's password, Password and PasswordFile may be set.
	Password, PasswordFile string
	// SentinelMaster names the primary's master set, making a redis:// or rediss:// URL's
	// addresses the sentinels'.
	SentinelMaster string
	// SentinelUsername and SentinelPassword (or SentinelPasswordFile) authenticate to the
	// sentinels themselves (their requirepass or ACL), which may differ from the data
	// nodes'.
	SentinelUsername, SentinelPassword, SentinelPasswordFile string
	// CAFile is a PEM bundle of the CAs that sign the servers' certificates (default: the
	// system's). CertFile and KeyFile are a client certificate, for servers started with
	// tls-auth-clients. All three need a rediss URL.
	CAFile, CertFile, KeyFile string
	// ServerName is the name to verify the servers' certificates against (default: the
	// URL's first host).
	ServerName string
}

// Resolved is a validated configuration, ready for go-redis.
type Resolved struct {
	// Mode is the kind of deployment.
	Mode Mode
	// Options build the client with redis.NewUniversalClient: MasterName is set for
	// Sentinel, IsClusterMode for Cluster.
	Options *redis.UniversalOptions
	// Redacted is the URL without its password, for logs and errors.
	Redacted string
	// Warnings are things the caller should log (a password inside the URL, TLS
	// verification turned off). They never contain a secret.
	Warnings []string
}

// NewClient builds the go-redis client the options describe; it does not dial yet.
func (r *Resolved) NewClient() redis.UniversalClient { return redis.NewUniversalClient(r.Options) }

// Addrs is the configured addresses joined by commas (the sentinels' for Sentinel), for
// messages; it holds no secret.
func (r *Resolved) Addrs() string {
	s := strings.Join(r.Options.Addrs, ",")
	if r.Mode == Sentinel {
		s = "master " + r.Options.MasterName + " via sentinels " + s
	}
	return s
}

// scheme is what a URL scheme means.
type scheme struct {
	tls  bool
	mode Mode
	set  bool // the scheme itself names the mode (+sentinel, +cluster)
}

var schemes = map[string]scheme{
	"redis":           {},
	"rediss":          {tls: true},
	"redis+sentinel":  {mode: Sentinel, set: true},
	"rediss+sentinel": {tls: true, mode: Sentinel, set: true},
	"redis+cluster":   {mode: Cluster, set: true},
	"rediss+cluster":  {tls: true, mode: Cluster, set: true},
}

// reserved are query options go-redis knows that a URL here must express otherwise: they
// would bypass the checks (addresses, master, database) or put a secret in the query.
var reserved = map[string]string{
	"addr":              "list every address in the host part, separated by commas",
	"master_name":       "put the master name in the path of a redis+sentinel:// URL",
	"db":                "put the database number in the path",
	"username":          "put the user in the URL's user part",
	"password":          "use a password file or the environment",
	"sentinel_username": "set the sentinel user separately",
	"sentinel_password": "use a sentinel password file or the environment",
}

// invalid builds a configuration error: ErrInvalid, then kind, then the detail.
func invalid(kind error, format string, a ...any) error {
	return fmt.Errorf("%w: %w: %s", ErrInvalid, kind, fmt.Sprintf(format, a...))
}

// Redact returns raw without the password of its user part (or of a password query
// option), for logs and errors. A string that does not parse as a URL is cut down to its
// scheme, since it may still hold a secret.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		if i := strings.Index(raw, "://"); i >= 0 && !strings.ContainsAny(raw[:i], "@:") {
			return raw[:i] + "://(unparsable)"
		}
		return "(unparsable redis URL)"
	}
	return redacted(u)
}

// redacted is u.Redacted with password query options masked too.
func redacted(u *url.URL) string {
	if u.RawQuery != "" {
		q := u.Query()
		masked := false
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") {
				q[k] = []string{"xxxxx"}
				masked = true
			}
		}
		if masked {
			c := *u
			c.RawQuery = q.Encode()
			return c.Redacted()
		}
	}
	return u.Redacted()
}

// parseScheme splits off and checks raw's scheme.
func parseScheme(raw string) (string, scheme, error) {
	i := strings.Index(raw, "://")
	if i <= 0 {
		return "", scheme{}, invalid(ErrScheme, "%s: want redis://, rediss://, redis+sentinel:// or redis+cluster:// (host:port alone is not a URL)", Redact(raw))
	}
	name := strings.ToLower(raw[:i])
	s, ok := schemes[name]
	if !ok {
		// The scheme holds no secret; the rest might.
		return "", scheme{}, invalid(ErrScheme, "%q: want redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster or rediss+cluster", name)
	}
	return name, s, nil
}

// LoadEnv fills the passwords the configuration does not already get elsewhere from the
// environment (lookup is os.LookupEnv in a main): EnvPassword, else EnvRedisCLIAuth, for the
// data nodes; EnvSentinelPassword for the sentinels. A password in the URL or a file wins
// over the environment, so a variable set for another tool does not make Resolve refuse
// the configuration.
func (c *Config) LoadEnv(lookup func(string) (string, bool)) {
	// The user part is what precedes the last @ of the authority (several hosts after it
	// would not parse as one URL).
	urlPassword := false
	if i := strings.Index(c.URL, "://"); i >= 0 {
		rest := c.URL[i+3:]
		if end := strings.IndexAny(rest, "/?#"); end >= 0 {
			rest = rest[:end]
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			urlPassword = strings.Contains(rest[:at], ":")
		}
	}
	if c.Password == "" && c.PasswordFile == "" && !urlPassword {
		if v, ok := lookup(EnvPassword); ok && v != "" {
			c.Password = v
		} else if v, ok := lookup(EnvRedisCLIAuth); ok && v != "" {
			c.Password = v
		}
	}
	if c.SentinelPassword == "" && c.SentinelPasswordFile == "" {
		if v, ok := lookup(EnvSentinelPassword); ok && v != "" {
			c.SentinelPassword = v
		}
	}
}

// Resolve checks the configuration, reads its files (passwords, CA, client certificate) and
// returns go-redis options. Every error wraps ErrInvalid and names the problem without the
// password.
func (c Config) Resolve() (*Resolved, error) {
	if c.URL == "" {
		return nil, invalid(ErrURL, "no Redis URL")
	}
	name, sch, err := parseScheme(c.URL)
	if err != nil {
		return nil, err
	}
	// The host part may list several addresses, which url.Parse does not take: split them
	// off and let it check the rest (user, first host, path, query) with the first one.
	rest := c.URL[len(name)+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	auth := rest[:end]
	at := strings.LastIndex(auth, "@")
	hostList := auth[at+1:]
	hosts := strings.Split(hostList, ",")
	u, err := url.Parse(c.URL[:len(name)+3] + auth[:at+1] + hosts[0] + rest[end:])
	if err != nil {
		// url.Error repeats the whole URL, password included: keep only its reason.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return nil, invalid(ErrURL, "%s: %v", Redact(c.URL), err)
	}
	ru := *u
	ru.Host = hostList
	red := redacted(&ru)
	r := &Resolved{Mode: sch.mode, Redacted: red}
	if u.Opaque != "" || hostList == "" {
		return nil, invalid(ErrURL, "%s: no host", red)
	}
	if u.Fragment != "" {
		return nil, invalid(ErrURL, "%s: unexpected #fragment", red)
	}

	// Mode: the scheme, else the sentinel master setting, else how many addresses.
	if c.SentinelMaster != "" {
		if sch.set && sch.mode != Sentinel {
			return nil, invalid(ErrConflict, "%s is a %s URL but a sentinel master (%q) is set", red, sch.mode, c.SentinelMaster)
		}
		r.Mode = Sentinel
	} else if !sch.set && len(hosts) > 1 {
		r.Mode = Cluster
	}
	defPort := DefaultPort
	if r.Mode == Sentinel {
		defPort = DefaultSentinelPort
	}
	addrs := make([]string, 0, len(hosts))
	for _, h := range hosts {
		a, err := splitAddr(h, defPort)
		if err != nil {
			return nil, invalid(ErrURL, "%s: address %q: %v", red, h, err)
		}
		addrs = append(addrs, a)
	}

	// Path: [/master][/db].
	var segs []string
	if p := strings.Trim(u.Path, "/"); p != "" {
		segs = strings.Split(p, "/")
	}
	master, db := "", 0
	if r.Mode == Sentinel {
		switch {
		case c.SentinelMaster != "" && !sch.set:
			master = c.SentinelMaster
		case len(segs) > 0:
			master, segs = segs[0], segs[1:]
			if c.SentinelMaster != "" && c.SentinelMaster != master {
				return nil, invalid(ErrConflict, "%s names master %q but the sentinel master setting says %q", red, master, c.SentinelMaster)
			}
		}
		if strings.TrimSpace(master) == "" {
			return nil, invalid(ErrNoMaster, "%s: want %s://host:port[,host:port...]/MASTER[/db]", red, name)
		}
	}
	switch len(segs) {
	case 0:
	case 1:
		n, err := strconv.Atoi(segs[0])
		if err != nil || n < 0 {
			return nil, invalid(ErrURL, "%s: database %q is not a number >= 0", red, segs[0])
		}
		db = n
	default:
		return nil, invalid(ErrURL, "%s: path %q: want [/db] (or /MASTER[/db] for sentinel)", red, u.Path)
	}
	if r.Mode == Cluster && db != 0 {
		return nil, invalid(ErrURL, "%s: a cluster has only database 0", red)
	}

	// Query options: go-redis's own, minus the ones that must be said another way.
	q := u.Query()
	for k := range q {
		if why, ok := reserved[k]; ok {
			return nil, invalid(ErrURL, "%s: option %q is not accepted here: %s", red, k, why)
		}
	}
	opts, err := goRedisOptions(r.Mode, sch.tls, addrs, q)
	if err != nil {
		return nil, invalid(ErrURL, "%s: %v", red, err)
	}
	if opts.RouteByLatency || opts.RouteRandomly || opts.ReadOnly {
		return nil, invalid(ErrURL, "%s: read routing to replicas is not supported: the control plane reads and writes the primary", red)
	}
	opts.MasterName = master
	opts.DB = db
	opts.IsClusterMode = r.Mode == Cluster

	if err := c.credentials(u, r, opts); err != nil {
		return nil, err
	}
	if err := c.tls(sch.tls, addrs[0], red, opts, r); err != nil {
		return nil, err
	}
	r.Options = opts
	return r, nil
}

// credentials sets the data nodes' and the sentinels' user and password.
func (c Config) credentials(u *url.URL, r *Resolved, o *redis.UniversalOptions) error {
	red := r.Redacted
	var urlUser, urlPass string
	hasURLPass := false
	if u.User != nil {
		urlUser = u.User.Username()
		urlPass, hasURLPass = u.User.Password()
	}
	switch {
	case urlUser != "" && c.Username != "" && urlUser != c.Username:
		return invalid(ErrConflict, "%s has user %q but the user setting says %q", red, urlUser, c.Username)
	case urlUser != "":
		o.Username = urlUser
	default:
		o.Username = c.Username
	}
	given := 0
	for _, set := range []bool{hasURLPass, c.Password != "", c.PasswordFile != ""} {
		if set {
			given++
		}
	}
	if given > 1 {
		return invalid(ErrConflict, "%s: the password comes from more than one of the URL, the password setting and the password file", red)
	}
	switch {
	case hasURLPass:
		o.Password = urlPass
		r.Warnings = append(r.Warnings, "the Redis URL carries a password, which ps and shell history can show: prefer a password file or "+EnvPassword)
	case c.PasswordFile != "":
		p, err := readSecret(c.PasswordFile)
		if err != nil {
			return err
		}
		o.Password = p
	default:
		o.Password = c.Password
	}
	sentinel := c.SentinelUsername != "" || c.SentinelPassword != "" || c.SentinelPasswordFile != ""
	if sentinel && r.Mode != Sentinel {
		return invalid(ErrConflict, "%s: sentinel credentials are set but the URL is not a sentinel one", red)
	}
	if c.SentinelPassword != "" && c.SentinelPasswordFile != "" {
		return invalid(ErrConflict, "the sentinel password setting and the sentinel password file are exclusive")
	}
	o.SentinelUsername, o.SentinelPassword = c.SentinelUsername, c.SentinelPassword
	if c.SentinelPasswordFile != "" {
		p, err := readSecret(c.SentinelPasswordFile)
		if err != nil {
			return err
		}
		o.SentinelPassword = p
	}
	return nil
}

// tls sets up TLS for a rediss URL, and refuses TLS files for a plain one: a CA file given
// with redis:// is a mistake that would otherwise silently talk plain text.
func (c Config) tls(on bool, first, red string, o *redis.UniversalOptions, r *Resolved) error {
	if !on {
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != "" {
			return invalid(ErrTLSFiles, "%s: TLS settings (CA file, client certificate, server name) need a rediss:// URL", red)
		}
		o.TLSConfig = nil
		return nil
	}
	cfg := o.TLSConfig
	if cfg == nil {
		cfg = &tls.Config{}
	}
	cfg.MinVersion = tls.VersionTLS12
	// The first address's host, as go-redis would use; the others must present a
	// certificate for the same name (or ServerName says which).
	cfg.ServerName, _, _ = net.SplitHostPort(first)
	if c.ServerName != "" {
		cfg.ServerName = c.ServerName
	}
	if cfg.InsecureSkipVerify {
		r.Warnings = append(r.Warnings, "skip_verify=true: the Redis servers' certificates are not checked, so TLS does not stop a man in the middle")
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return invalid(ErrTLSFiles, "CA file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return invalid(ErrTLSFiles, "CA file %s holds no PEM certificate", c.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		pair, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return invalid(ErrTLSFiles, "client certificate %s / key %s: %v", c.CertFile, c.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case c.CertFile != "" || c.KeyFile != "":
		return invalid(ErrTLSFiles, "a client certificate needs both the certificate file and the key file")
	}
	o.TLSConfig = cfg
	return nil
}

// readSecret reads a password file without the trailing newline editors add.
func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", invalid(ErrSecretFile, "%v", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", invalid(ErrSecretFile, "%s is empty", path)
	}
	return s, nil
}

// splitAddr checks one host[:port] and adds the default port.
func splitAddr(h, defPort string) (string, error) {
	if h == "" {
		return "", errors.New("empty (two commas, or a trailing one?)")
	}
	host, port := h, defPort
	switch {
	case strings.HasPrefix(h, "["):
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", errors.New("unclosed [")
		}
		host = h[1:end]
		if rest := h[end+1:]; rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return "", errors.New("junk after ]")
			}
			port = rest[1:]
		}
	case strings.Count(h, ":") == 1:
		var err error
		if host, port, err = net.SplitHostPort(h); err != nil {
			return "", err
		}
	case strings.Count(h, ":") > 1:
		return "", errors.New("an IPv6 address needs brackets: [addr]:port")
	}
	if host == "" {
		return "", errors.New("no host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("port %q is not a number in 1..65535", port)
	}
	return net.JoinHostPort(host, port), nil
}

// goRedisOptions lets go-redis parse its own query options (pool_size, timeouts, ...) for
// the mode, by handing it the equivalent URL in its own dialect, and copies the result into
// universal options.
func goRedisOptions(mode Mode, tlsOn bool, addrs []string, q url.Values) (*redis.UniversalOptions, error) {
	s := "redis"
	if tlsOn {
		s = "rediss"
	}
	q2 := url.Values{}
	for k, v := range q {
		q2[k] = v
	}
	for _, a := range addrs[1:] {
		q2.Add("addr", a)
	}
	if mode == Sentinel {
		q2.Set("master_name", "-") // a placeholder: Resolve sets the checked name
	}
	gu := (&url.URL{Scheme: s, Host: addrs[0], RawQuery: q2.Encode()}).String()
	switch mode {
	case Sentinel:
		f, err := redis.ParseFailoverURL(gu)
		if err != nil {
			return nil, err
		}
		if f.ReplicaOnly || f.UseDisconnectedReplicas {
			return nil, errors.New("replica_only and use_disconnected_replicas are not supported: the control plane needs the primary")
		}
		return fromFailover(f), nil
	case Cluster:
		cl, err := redis.ParseClusterURL(gu)
		if err != nil {
			return nil, err
		}
		return fromCluster(cl), nil
	default:
		if len(addrs) > 1 {
			return nil, errors.New("several addresses")
		}
		o, err := redis.ParseURL(gu)
		if err != nil {
			return nil, err
		}
		return fromSingle(o), nil
	}
}

func fromSingle(o *redis.Options) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs: []string{o.Addr}, ClientName: o.ClientName, Protocol: o.Protocol,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries, DialerRetryTimeout: o.DialerRetryTimeout,
		ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, MaxConcurrentDials: o.MaxConcurrentDials, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime, ConnMaxLifetimeJitter: o.ConnMaxLifetimeJitter,
		PipelinePoolSize: o.PipelinePoolSize, PipelineReadBufferSize: o.PipelineReadBufferSize, PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		TLSConfig: o.TLSConfig, DisableIdentity: o.DisableIdentity, IdentitySuffix: o.IdentitySuffix,
	}
}

func fromFailover(o *redis.FailoverOptions) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs: o.SentinelAddrs, ClientName: o.ClientName, Protocol: o.Protocol,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries, DialerRetryTimeout: o.DialerRetryTimeout,
		ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, MaxConcurrentDials: o.MaxConcurrentDials, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime, ConnMaxLifetimeJitter: o.ConnMaxLifetimeJitter,
		PipelinePoolSize: o.PipelinePoolSize, PipelineReadBufferSize: o.PipelineReadBufferSize, PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		TLSConfig: o.TLSConfig, DisableIdentity: o.DisableIdentity, IdentitySuffix: o.IdentitySuffix,
		RouteByLatency: o.RouteByLatency, RouteRandomly: o.RouteRandomly,
	}
}

func fromCluster(o *redis.ClusterOptions) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs: o.Addrs, ClientName: o.ClientName, Protocol: o.Protocol,
		MaxRetries: o.MaxRetries, MinRetryBackoff: o.MinRetryBackoff, MaxRetryBackoff: o.MaxRetryBackoff,
		DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries, DialerRetryTimeout: o.DialerRetryTimeout,
		ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolFIFO: o.PoolFIFO, PoolSize: o.PoolSize, MaxConcurrentDials: o.MaxConcurrentDials, PoolTimeout: o.PoolTimeout,
		MinIdleConns: o.MinIdleConns, MaxIdleConns: o.MaxIdleConns, MaxActiveConns: o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime, ConnMaxLifetime: o.ConnMaxLifetime, ConnMaxLifetimeJitter: o.ConnMaxLifetimeJitter,
		PipelinePoolSize: o.PipelinePoolSize, PipelineReadBufferSize: o.PipelineReadBufferSize, PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		TLSConfig: o.TLSConfig, MaxRedirects: o.MaxRedirects, ReadOnly: o.ReadOnly,
		RouteByLatency: o.RouteByLatency, RouteRandomly: o.RouteRandomly, FailingTimeoutSeconds: o.FailingTimeoutSeconds,
	}
}
