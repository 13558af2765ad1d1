package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// keysCmd creates and shows the fleet's keys: the fleet secret trainers hold, and each
// server's issued key.
func (fc *fleetCmd) keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Create the fleet secret, issue each server its own key, show key ids",
		Long: "Trainers hold the fleet secret: it signs commands and desired states (an Ed25519 key\n" +
			"derived from it) and checks every server's heartbeats and acks. Servers should hold\n" +
			"only an issued key (--fleet-key-file): it checks the trainer's signatures and signs that\n" +
			"server's own messages, nothing more, so a compromised server speaks only for itself.",
	}
	cmd.AddCommand(fc.keysNewCmd(), fc.keysIssueCmd(), fc.keysShowCmd())
	return cmd
}

func (fc *fleetCmd) keysNewCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "new --out FILE",
		Short: "Write a new random fleet secret (32 bytes, base64) to FILE, mode 0600",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return errors.New("--out is required")
			}
			b := make([]byte, 32)
			_, _ = rand.Read(b) // crypto/rand.Read never fails (Go >= 1.24)
			secret := base64.StdEncoding.EncodeToString(b)
			if err := writeNew(out, []byte(secret+"\n")); err != nil {
				return err
			}
			a, err := protocol.NewAuth([]byte(secret))
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: fleet secret, trainer key id %s\n", out, a.KeyID())
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to create (refused when it exists)")
	return cmd
}

func (fc *fleetCmd) keysIssueCmd() *cobra.Command {
	var out, id string
	var previous []string
	cmd := &cobra.Command{
		Use:   "issue --fleet NAME --fleet-secret-file SECRET --server-id ID --out FILE",
		Short: "Issue server ID its own key (for rollout serve --fleet-key-file), mode 0600",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" || id == "" || fc.conn.fleet == "" {
				return errors.New("--fleet, --server-id and --out are required")
			}
			a, err := fc.secretAuth(previous)
			if err != nil {
				return err
			}
			b, err := a.IssueServerKey(fc.conn.fleet, id)
			if err != nil {
				return err
			}
			if err := writeNew(out, b); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: key of server %s in fleet %s, issued under trainer key %s, trusting %d trainer key(s)\n",
				out, id, fc.conn.fleet, a.KeyID(), len(a.TrustedKeys()))
			return err
		},
	}
	cmd.Flags().StringVar(&id, "server-id", "", "the server the key speaks for (its rollout serve --server-id)")
	cmd.Flags().StringVar(&out, "out", "", "file to create (refused when it exists)")
	cmd.Flags().StringSliceVar(&previous, "also-trust", nil, "files of earlier fleet secrets whose trainer keys the server also trusts (during a rotation)")
	return cmd
}

func (fc *fleetCmd) keysShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show [SERVER-KEY-FILE]",
		Short: "Print the trainer key id and public key of --fleet-secret-file, or what a server key file holds",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if len(args) == 1 {
				b, err := os.ReadFile(args[0])
				if err != nil {
					return err
				}
				a, err := protocol.ParseServerKey(b)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(w, "server %s, issued under trainer key %s\ntrusted trainer keys:\n", a.ServerID(), a.KeyID())
				for _, k := range a.TrustedKeys() {
					_, err = fmt.Fprintf(w, "  %s\n", k)
				}
				return err
			}
			a, err := fc.secretAuth(nil)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(w, "trainer key id %s\npublic key %s\n", a.KeyID(), a.TrustedKeys()[0])
			return err
		},
	}
}

// secretAuth is the Auth of --fleet-secret(-file), with the earlier secrets in files
// trusted too.
func (fc *fleetCmd) secretAuth(previous []string) (*protocol.Auth, error) {
	secret := fc.conn.secret
	if fc.conn.secretFile != "" {
		s, err := readSecretFile(fc.conn.secretFile)
		if err != nil {
			return nil, fmt.Errorf("--fleet-secret-file: %w", err)
		}
		secret = s
	}
	if secret == "" {
		return nil, errors.New("--fleet-secret-file is required (the fleet secret the key is issued under)")
	}
	secrets := [][]byte{[]byte(secret)}
	for _, f := range previous {
		s, err := readSecretFile(f)
		if err != nil {
			return nil, fmt.Errorf("--also-trust: %w", err)
		}
		secrets = append(secrets, []byte(s))
	}
	return protocol.NewAuth(secrets...)
}

// writeNew creates path with mode 0600 and writes b, refusing to overwrite a key.
func writeNew(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
