package redisconf

import "flag"

// Flag names RegisterFlags defines.
const (
	FlagURL                  = "redis"
	FlagUser                 = "redis-user"
	FlagPasswordFile         = "redis-password-file"
	FlagSentinelMaster       = "redis-sentinel-master"
	FlagSentinelUser         = "redis-sentinel-user"
	FlagSentinelPasswordFile = "redis-sentinel-password-file"
	FlagCAFile               = "redis-ca-file"
	FlagCertFile             = "redis-cert-file"
	FlagKeyFile              = "redis-key-file"
	FlagTLSServerName        = "redis-tls-server-name"
)

// RegisterFlags defines the flags that fill c on fs, the same for every program (the rollout
// CLI adds them to its commands' flag sets, examples use them as they are); usage describes
// --redis for the program. Passwords have no flag of their own, since ps shows flags: a file
// flag, the environment (LoadEnv) or the URL.
func (c *Config) RegisterFlags(fs *flag.FlagSet, usage string) {
	fs.StringVar(&c.URL, FlagURL, "", usage+": redis://[user@]host:port[/db], rediss:// (TLS), "+
		"redis+sentinel://host:port,host:port/MASTER[/db] or redis+cluster://host:port,host:port,...")
	fs.StringVar(&c.Username, FlagUser, "", "Redis ACL user (when the URL has none)")
	fs.StringVar(&c.PasswordFile, FlagPasswordFile, "",
		"file holding the Redis password (trailing newline ignored); or set "+EnvPassword+" (else "+EnvRedisCLIAuth+")")
	fs.StringVar(&c.SentinelMaster, FlagSentinelMaster, "", "Sentinel master set name: --"+FlagURL+" then lists the sentinels' addresses")
	fs.StringVar(&c.SentinelUsername, FlagSentinelUser, "", "ACL user of the sentinels themselves")
	fs.StringVar(&c.SentinelPasswordFile, FlagSentinelPasswordFile, "",
		"file holding the sentinels' own password; or set "+EnvSentinelPassword)
	fs.StringVar(&c.CAFile, FlagCAFile, "", "PEM CA bundle that signs the Redis servers' certificates (rediss:// only; default: the system's)")
	fs.StringVar(&c.CertFile, FlagCertFile, "", "client certificate for Redis TLS (rediss:// only; with --"+FlagKeyFile+")")
	fs.StringVar(&c.KeyFile, FlagKeyFile, "", "key of the Redis TLS client certificate")
	fs.StringVar(&c.ServerName, FlagTLSServerName, "", "name the Redis servers' certificates must carry (default: the URL's first host)")
}
