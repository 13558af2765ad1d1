// Package compose holds the test of the repository's docker-compose.yml: it loads the file
// with compose-go, the library docker compose itself uses, so a file that compose would
// reject fails here, and checks the services, ports and health checks the README promises.
// It lives in the tools module so that compose-go's dependencies stay out of the main
// module that importers of the SDK inherit.
package compose
