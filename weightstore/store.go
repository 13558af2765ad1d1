package weightstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Sentinel errors callers branch on; returned errors wrap them with details.
var (
	// ErrVersionExists means Publish was asked for a version the store already holds:
	// versions are immutable, since servers may have verified them.
	ErrVersionExists = errors.New("weightstore: version already published")
	// ErrNotFound means a version the store does not hold.
	ErrNotFound = errors.New("weightstore: version not found")
	// ErrInvalidVersion means a negative version number.
	ErrInvalidVersion = errors.New("weightstore: invalid version")
	// ErrDigest means Adopt was given a checkpoint that does not hash to its digest.
	ErrDigest = errors.New("weightstore: digest mismatch")
)

// Entry describes one published version.
type Entry struct {
	// Version is the weight version.
	Version int64 `json:"version"`
	// SHA256 is the hex digest weights.Digest computes for the checkpoint.
	SHA256 string `json:"sha256"`
	// Path is the version's URL path under the store's root, "/vN/".
	Path string `json:"path"`
	// Files are the checkpoint's file names, the ones the digest covers.
	Files []string `json:"files"`
	// Bytes is the checkpoint's total size.
	Bytes int64 `json:"bytes"`
	// Published is when the version appeared in the directory.
	Published time.Time `json:"published"`
}

// Index is what the handler serves at / and /index.json: every version, oldest first.
type Index struct {
	Versions []Entry `json:"versions"`
	// Latest is the newest version, -1 when the store is empty.
	Latest int64 `json:"latest"`
}

// Store is a directory of versions. It may be shared with other processes publishing into
// the same directory: Refresh (which the handler calls) picks up their versions.
type Store struct {
	dir     string
	mu      sync.Mutex
	entries map[int64]cached
	dtype   weights.DType // of the checkpoints Publish writes; guarded by mu
	// served counts the checkpoint bytes the handler wrote: the store's egress.
	served atomic.Int64
}

type cached struct {
	entry Entry
	mod   time.Time // the version directory's modification time when the digest was taken
}

// VersionDir is the directory name of version v: "vN".
func VersionDir(v int64) string { return "v" + strconv.FormatInt(v, 10) }

// parseVersionDir returns N for a name "vN" (N a canonical non-negative decimal).
func parseVersionDir(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, "v")
	if !ok || s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil && v >= 0
}

// Open opens (creating it if needed) the store in dir and indexes the versions already there.
func Open(ctx context.Context, dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("weightstore: %w", err)
	}
	s := &Store{dir: dir, entries: map[int64]cached{}}
	if err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Refresh rescans the directory: versions published by another process are added (their
// digests computed once), removed ones dropped. Directories that are not "vN" are ignored, so
// are unfinished ones (Publish renames a complete checkpoint into place).
func (s *Store) Refresh(ctx context.Context) error {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("weightstore: %w", err)
	}
	seen := map[int64]bool{}
	for _, de := range des {
		v, ok := parseVersionDir(de.Name())
		if !ok || !de.IsDir() {
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue // removed while scanning
		}
		seen[v] = true
		s.mu.Lock()
		c, have := s.entries[v]
		s.mu.Unlock()
		if have && c.mod.Equal(info.ModTime()) {
			continue
		}
		e, err := describe(ctx, filepath.Join(s.dir, de.Name()), v)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue // not a checkpoint (yet): not served
		}
		e.Published = info.ModTime()
		s.mu.Lock()
		s.entries[v] = cached{e, info.ModTime()}
		s.mu.Unlock()
	}
	s.mu.Lock()
	for v := range s.entries {
		if !seen[v] {
			delete(s.entries, v)
		}
	}
	s.mu.Unlock()
	return nil
}

// describe lists a checkpoint directory's files and computes its digest.
func describe(ctx context.Context, path string, v int64) (Entry, error) {
	sum, err := weights.Digest(ctx, path)
	if err != nil {
		return Entry{}, err
	}
	files := []string{weights.ConfigFile}
	if _, err := os.Stat(filepath.Join(path, weights.SafetensorsFile)); err == nil {
		files = append(files, weights.SafetensorsFile)
	} else {
		// Sharded: the index and the shards beside it (the digest has checked the index names
		// only plain files here).
		files = append(files, weights.IndexFile)
		shards, _ := filepath.Glob(filepath.Join(path, "*.safetensors"))
		for _, sh := range shards {
			files = append(files, filepath.Base(sh))
		}
	}
	e := Entry{Version: v, SHA256: sum, Path: "/" + VersionDir(v) + "/", Files: files}
	for _, f := range files {
		st, err := os.Stat(filepath.Join(path, f))
		if err != nil {
			return Entry{}, err
		}
		e.Bytes += st.Size()
	}
	return e, nil
}

// SetDType sets the dtype of the checkpoints Publish writes from now on: weights.F32 (the
// default), or weights.BF16 (half the bytes to write, hash and fetch; the values rounded to
// bfloat16 once, which a server at bf16 precision would do anyway) or weights.F16.
func (s *Store) SetDType(d weights.DType) error {
	if d != weights.F32 && d != weights.BF16 && d != weights.F16 {
		return fmt.Errorf("weightstore: unknown dtype %v", d)
	}
	s.mu.Lock()
	s.dtype = d
	s.mu.Unlock()
	return nil
}

// Publish writes w as version v (safetensors of the SetDType dtype, float32 by default),
// computes its digest and makes it visible atomically: the checkpoint is written under a
// temporary name and renamed to vN, so readers never see half of it. A version already
// present returns ErrVersionExists.
func (s *Store) Publish(ctx context.Context, v int64, w *model.Weights) (Entry, error) {
	if v < 0 {
		return Entry{}, fmt.Errorf("%w: %d", ErrInvalidVersion, v)
	}
	final := filepath.Join(s.dir, VersionDir(v))
	if _, err := os.Stat(final); err == nil {
		return Entry{}, fmt.Errorf("%w: %d", ErrVersionExists, v)
	}
	tmp, err := os.MkdirTemp(s.dir, ".publish-"+VersionDir(v)+"-")
	if err != nil {
		return Entry{}, fmt.Errorf("weightstore: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	s.mu.Lock()
	dtype := s.dtype
	s.mu.Unlock()
	if err := weights.SaveHF(tmp, w, dtype); err != nil {
		return Entry{}, fmt.Errorf("weightstore: publish %d: %w", v, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Entry{}, fmt.Errorf("weightstore: %w", err)
	}
	e, err := describe(ctx, tmp, v)
	if err != nil {
		return Entry{}, fmt.Errorf("weightstore: publish %d: %w", v, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(final); serr == nil {
			return Entry{}, fmt.Errorf("%w: %d", ErrVersionExists, v)
		}
		return Entry{}, fmt.Errorf("weightstore: publish %d: %w", v, err)
	}
	return s.index(v, e, final)
}

// index records e, now in place at final, as version v, published at the directory's time.
func (s *Store) index(v int64, e Entry, final string) (Entry, error) {
	info, err := os.Stat(final)
	if err != nil {
		return Entry{}, fmt.Errorf("weightstore: %w", err)
	}
	e.Published = info.ModTime()
	s.mu.Lock()
	s.entries[v] = cached{e, info.ModTime()}
	s.mu.Unlock()
	return e, nil
}

// Adopt moves the checkpoint directory dir (on the store's file system) in as version v and
// indexes it, recomputing its digest: the store serves only what it hashed itself, and a
// digest other than sha (when set) refuses the version (ErrDigest) and removes it.
func (s *Store) Adopt(ctx context.Context, v int64, dir, sha string) (Entry, error) {
	if v < 0 {
		return Entry{}, fmt.Errorf("%w: %d", ErrInvalidVersion, v)
	}
	final := filepath.Join(s.dir, VersionDir(v))
	if _, err := os.Stat(final); err == nil {
		return Entry{}, fmt.Errorf("%w: %d", ErrVersionExists, v)
	}
	if err := os.Rename(dir, final); err != nil {
		return Entry{}, fmt.Errorf("weightstore: adopt %d: %w", v, err)
	}
	e, err := describe(ctx, final, v)
	if err == nil && sha != "" && !strings.EqualFold(sha, e.SHA256) {
		err = fmt.Errorf("%w: version %d hashes to %s, want %s", ErrDigest, v, e.SHA256, sha)
	}
	if err != nil {
		_ = os.RemoveAll(final)
		return Entry{}, fmt.Errorf("weightstore: adopt %d: %w", v, err)
	}
	return s.index(v, e, final)
}

// Remove deletes version v (a no-op when absent). Downloads in flight keep their open files.
func (s *Store) Remove(v int64) error {
	s.mu.Lock()
	delete(s.entries, v)
	s.mu.Unlock()
	if err := os.RemoveAll(filepath.Join(s.dir, VersionDir(v))); err != nil {
		return fmt.Errorf("weightstore: %w", err)
	}
	return nil
}

// BytesServed is how many checkpoint file bytes the handler has written: the store's egress.
func (s *Store) BytesServed() int64 { return s.served.Load() }

// Versions lists the known versions, oldest first.
func (s *Store) Versions() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.entries))
	for _, c := range s.entries {
		out = append(out, c.entry)
	}
	slices.SortFunc(out, func(a, b Entry) int { return cmp.Compare(a.Version, b.Version) })
	return out
}

// Get returns version v's entry, or ErrNotFound.
func (s *Store) Get(v int64) (Entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.entries[v]
	if !ok {
		return Entry{}, fmt.Errorf("%w: %d", ErrNotFound, v)
	}
	return c.entry, nil
}

// Latest returns the newest version; false when the store is empty.
func (s *Store) Latest() (Entry, bool) {
	vs := s.Versions()
	if len(vs) == 0 {
		return Entry{}, false
	}
	return vs[len(vs)-1], true
}

// Ref is the ref of version v served under baseURL (e.g. "http://host:port", or
// "file:///dir" for servers that read the store's directory): the URI a server's
// update fetches and the digest it verifies. protocol.WeightsRef is sdk.WeightsRef, so the
// result goes straight to sdk.Client.UpdateWeights. Errors: ErrNotFound.
func (s *Store) Ref(baseURL string, v int64) (protocol.WeightsRef, error) {
	e, err := s.Get(v)
	if err != nil {
		return protocol.WeightsRef{}, err
	}
	return e.Ref(baseURL), nil
}

// PublishRef publishes w as version v (see Publish) unless the store already holds v, and
// returns its ref under baseURL (see Ref): the one call from trained weights to an update.
// A version already present is not rewritten, so a loop that restarts after publishing
// but before updating gets the same ref again. Errors: ErrInvalidVersion, and the
// failures of writing the checkpoint.
func (s *Store) PublishRef(ctx context.Context, baseURL string, v int64, w *model.Weights) (protocol.WeightsRef, error) {
	if _, err := s.Get(v); errors.Is(err, ErrNotFound) {
		if _, err := s.Publish(ctx, v, w); err != nil && !errors.Is(err, ErrVersionExists) {
			return protocol.WeightsRef{}, err
		}
	}
	return s.Ref(baseURL, v)
}

// Ref is the entry's ref under baseURL (see Store.Ref).
func (e Entry) Ref(baseURL string) protocol.WeightsRef {
	return protocol.WeightsRef{Version: e.Version, URI: strings.TrimSuffix(baseURL, "/") + e.Path, SHA256: e.SHA256}
}

// Prune removes all but the newest keep versions (keep >= 1), oldest first.
func (s *Store) Prune(keep int) error {
	if keep < 1 {
		return fmt.Errorf("%w: prune must keep at least one version (got %d)", ErrInvalidVersion, keep)
	}
	vs := s.Versions()
	for _, e := range vs[:max(0, len(vs)-keep)] {
		if err := os.RemoveAll(filepath.Join(s.dir, VersionDir(e.Version))); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("weightstore: prune: %w", err)
		}
		s.mu.Lock()
		delete(s.entries, e.Version)
		s.mu.Unlock()
	}
	return nil
}
