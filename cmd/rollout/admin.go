package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/server"
)

// errAdminStatus wraps the error of an admin call the server refused.
var errAdminStatus = errors.New("admin call refused")

// adminFlags are where `rollout admin` sends its call and how it finds the token.
type adminFlags struct {
	server, tokenFile, stateDir string
	printToken                  bool
	timeout                     time.Duration
}

// token finds the admin token: --admin-token-file, else the file `rollout serve` wrote for
// the server's port in --state-dir.
func (o adminFlags) token() (string, error) {
	path := o.tokenFile
	if path == "" {
		u, err := url.Parse(o.server)
		if err != nil || u.Host == "" {
			return "", fmt.Errorf("--server %q: want http://HOST:PORT", o.server)
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"https": "443"}[u.Scheme]
			if port == "" {
				port = "80"
			}
		}
		dir := o.stateDir
		if dir == "" {
			dir = server.DefaultStateDir()
		}
		path = server.AdminTokenFile(dir, port)
	}
	tok, err := readSecretFile(path)
	if err != nil {
		return "", fmt.Errorf("admin token: %w (rollout serve writes it there when it has no --admin-token; else pass --admin-token-file)", err)
	}
	return tok, nil
}

func newAdminCmd() *cobra.Command {
	var o adminFlags
	cmd := &cobra.Command{
		Use:   "admin METHOD PATH [JSON]",
		Short: "Call an admin route of a running server with its admin token (pause, sleep, update_weights, state...)",
		Long: "Call an admin route of `rollout serve` and print the answer. The token is --admin-token-file,\n" +
			"else the one the server generated at start into --state-dir/admin-token-PORT (mode 0600). Exits\n" +
			"1 with the server's error line when the call is refused. --print-token prints the token instead,\n" +
			"for curl: curl -H \"Authorization: Bearer $(rollout admin --print-token)\" ...\n\n" +
			"  rollout admin POST '/pause?mode=keep&clear_cache=true'\n" +
			"  rollout admin POST /update_weights '{\"version\":2,\"source\":\"file:///ckpts/v2\"}'\n" +
			"  rollout admin GET /state",
		Args: func(cmd *cobra.Command, args []string) error {
			if o.printToken {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.RangeArgs(2, 3)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := o.token()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if o.printToken {
				_, err := fmt.Fprintln(out, tok)
				return err
			}
			method, path := strings.ToUpper(args[0]), args[1]
			if !strings.HasPrefix(path, "/") {
				path = "/" + path
			}
			var body io.Reader
			if len(args) == 3 {
				body = strings.NewReader(args[2])
			}
			req, err := http.NewRequestWithContext(cmd.Context(), method, strings.TrimSuffix(o.server, "/")+path, body)
			if err != nil {
				return fmt.Errorf("admin: %w", err)
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			if body != nil {
				req.Header.Set("Content-Type", "application/json")
			}
			client := &http.Client{Timeout: o.timeout, Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext}}
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("admin: %w", err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			if err != nil {
				return fmt.Errorf("admin: %w", err)
			}
			if resp.StatusCode >= 400 {
				var e struct {
					Error struct {
						Message string `json:"message"`
						Code    any    `json:"code"`
					} `json:"error"`
				}
				if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
					return fmt.Errorf("%w: %s %s: %d %v: %s", errAdminStatus, method, path, resp.StatusCode, e.Error.Code, e.Error.Message)
				}
				return fmt.Errorf("%w: %s %s: %s", errAdminStatus, method, path, resp.Status)
			}
			if _, err := out.Write(b); err != nil {
				return err
			}
			if len(b) > 0 && b[len(b)-1] != '\n' {
				_, err = fmt.Fprintln(out)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.server, "server", "http://127.0.0.1:8000", "base URL of the server (or of its --admin-addr listener)")
	f.StringVar(&o.tokenFile, "admin-token-file", "", "file holding the admin token (default: the one the server generated, in --state-dir)")
	f.StringVar(&o.stateDir, "state-dir", "", "directory rollout serve wrote admin-token-PORT to (default: as rollout serve's)")
	f.BoolVar(&o.printToken, "print-token", false, "print the admin token and exit")
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute, "deadline of the call")
	return cmd
}
