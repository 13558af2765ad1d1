package server

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUnsafeTokenDir means the directory of the admin token file is not private to this user:
// a symlink, not owned by the user, or writable by others (who could swap the file).
var ErrUnsafeTokenDir = errors.New("server: admin token directory is not private")

// DefaultStateDir is where `rollout serve` writes its generated admin token and `rollout
// admin` looks for it: $XDG_RUNTIME_DIR/rollout (a per-user tmpfs on systemd hosts), else
// $XDG_STATE_HOME/rollout, else ~/.local/state/rollout, else a directory named after the
// user id in the temporary directory.
func DefaultStateDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "rollout")
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "rollout")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return filepath.Join(h, ".local", "state", "rollout")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("rollout-%d", os.Getuid()))
}

// AdminTokenFile is the path of the generated admin token of the server listening on port,
// in dir (see DefaultStateDir).
func AdminTokenFile(dir, port string) string {
	return filepath.Join(dir, "admin-token-"+port)
}

// newAdminToken returns 32 random bytes in hex.
func newAdminToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("server: admin token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeAdminToken writes token to path, mode 0600, through a temporary file renamed into
// place, in a directory it creates 0700 and refuses when another user could change it.
func writeAdminToken(path, token string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("server: admin token file: %w", err)
	}
	if err := checkPrivateDir(dir); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".admin-token-*")
	if err != nil {
		return fmt.Errorf("server: admin token file: %w", err)
	}
	tmp := f.Name()
	_, err = f.WriteString(token + "\n")
	if err == nil {
		err = f.Chmod(0o600)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("server: admin token file: %w", err)
	}
	return nil
}

// checkPrivateDir refuses a directory that is a symlink, belongs to another user or is
// writable by group or others.
func checkPrivateDir(dir string) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("server: admin token file: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrUnsafeTokenDir, dir)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by others (mode %v)", ErrUnsafeTokenDir, dir, st.Mode().Perm())
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return fmt.Errorf("%w: %s belongs to uid %d", ErrUnsafeTokenDir, dir, sys.Uid)
	}
	return nil
}

// removeAdminToken removes the token file at path if it still holds token (a server started
// since on the same port has replaced it otherwise).
func removeAdminToken(path, token string) {
	if path == "" {
		return
	}
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(bytes.TrimSpace(b), []byte(token)) {
		_ = os.Remove(path)
	}
}
