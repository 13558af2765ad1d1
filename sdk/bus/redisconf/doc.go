// Package redisconf turns the one `--redis` value every rollout component takes (servers,
// the SDK, the CLI) into go-redis universal options: a single server, a Sentinel-managed
// primary or a Cluster, over plain TCP or TLS, with ACL credentials.
//
// Accepted URLs:
//
//	redis://[user[:password]@]host[:port][/db][?option=value...]
//	rediss://...                                  TLS (CAFile, CertFile/KeyFile, ServerName)
//	redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/master[/db]
//	rediss+sentinel://...                         TLS to the sentinels and the primary
//	redis+cluster://[user[:password]@]host[:port][,host[:port]...]
//	rediss+cluster://...
//
// A redis:// or rediss:// URL with several addresses is a Cluster; with Config.SentinelMaster
// set its addresses are the sentinels'. User and password in the URL are the data nodes'
// (ACL) credentials; the sentinels' own are SentinelUsername and SentinelPassword. Query
// options are go-redis's own (pool_size, dial_timeout, read_timeout, ...).
//
// Secrets need not appear where ps shows them: Password and SentinelPassword can come from a
// file (PasswordFile, SentinelPasswordFile) or, through LoadEnv, from the environment
// (ROLLOUT_REDIS_PASSWORD, falling back to redis-cli's REDISCLI_AUTH, and
// ROLLOUT_REDIS_SENTINEL_PASSWORD). A password inside the URL still works, but Resolve
// returns a warning for the caller to log, and every URL in a log or an error is Redact-ed.
//
// Every bad configuration is refused by Resolve with an error wrapping ErrInvalid and a more
// specific sentinel (ErrScheme, ErrURL, ErrNoMaster, ErrTLSFiles, ErrSecretFile, ErrConflict),
// so a component fails at start-up rather than in a reconnect loop, and never falls back to
// plain text when TLS was asked for.
package redisconf
