package weights

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/rolloutkit/rollout/engine/model"
)

// ErrFetch means a source could not be read: a local path that does not exist, or an
// http(s) download that failed (network error, non-200 status, more bytes than
// Options.MaxDownloadBytes). It is often worth retrying; the other errors are not.
var ErrFetch = errors.New("weights: fetch failed")

// DefaultMaxDownloadBytes caps an http(s) download when Options.MaxDownloadBytes is zero.
const DefaultMaxDownloadBytes = 16 << 30

// Ref names one version of the weights: where to fetch it and, optionally, its digest.
type Ref struct {
	Version int64  `json:"version"`
	URI     string `json:"uri"`
	SHA256  string `json:"sha256"`
}

// Validate checks that the ref has a URI and that SHA256, when set, is 64 hex digits.
func (r Ref) Validate() error {
	if r.URI == "" {
		return fmt.Errorf("%w: empty uri", ErrInvalidRef)
	}
	if r.SHA256 != "" {
		if b, err := hex.DecodeString(r.SHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%w: sha256 %q is not 64 hex digits", ErrInvalidRef, r.SHA256)
		}
	}
	return nil
}

// Options controls Load.
type Options struct {
	// Root, when set, restricts file sources (paths and file:// URIs) to this directory:
	// relative paths resolve inside it, absolute ones must lie inside it, and symlinks may not
	// lead out of it. Enforced with os.Root.
	Root string
	// RequireDigest refuses refs without a SHA-256.
	RequireDigest bool
	// HTTPClient fetches http(s) sources; nil means NewHTTPClient(FetchPolicy{}), which
	// refuses loopback and private addresses.
	HTTPClient *http.Client
	// MaxDownloadBytes caps the total bytes of one http(s) download; 0 means
	// DefaultMaxDownloadBytes.
	MaxDownloadBytes int64
	// TempDir holds downloads while they are loaded; "" means os.TempDir(). They are removed
	// before Load returns.
	TempDir string
}

// Checkpoint formats reported in Info.
const (
	FormatHF      = "hf"
	FormatLlama2C = "llama2c"
)

// Info describes what Load read.
type Info struct {
	Format string // FormatHF or FormatLlama2C
	Digest string // hex SHA-256 as defined by Digest, over the bytes that were parsed
	Bytes  int64  // total size of the checkpoint files
}

// Load fetches, verifies and loads the weights ref names. Sources: a local path or file://
// URI (a directory is a Hugging Face checkpoint, a *.bin file a llama2.c one), or an http(s)
// URL (a URL ending in .bin is a llama2.c file; any other is the base of a Hugging Face
// directory, from which config.json and model.safetensors, or the index and its shards, are
// fetched). The digest is computed while the files are parsed, so what is verified is what is
// loaded; a mismatch returns ErrDigestMismatch and no weights. The result has passed
// model.Weights.Check.
func Load(ctx context.Context, ref Ref, opts Options) (*model.Weights, error) {
	w, _, err := LoadWithInfo(ctx, ref, opts)
	return w, err
}

// LoadWithInfo is Load that also reports the format, digest and size of what it read.
func LoadWithInfo(ctx context.Context, ref Ref, opts Options) (*model.Weights, Info, error) {
	if err := ref.Validate(); err != nil {
		return nil, Info{}, err
	}
	if opts.RequireDigest && ref.SHA256 == "" {
		return nil, Info{}, fmt.Errorf("%w: version %d: a sha256 is required", ErrInvalidRef, ref.Version)
	}
	var (
		w    *model.Weights
		info Info
		err  error
	)
	scheme, _, hasScheme := strings.Cut(ref.URI, "://")
	switch s := strings.ToLower(scheme); {
	case hasScheme && (s == "http" || s == "https"):
		w, info, err = loadHTTP(ctx, ref.URI, opts)
		err = publicFetchError(ctx, ref.URI, err)
	case hasScheme && s == "file":
		var u *url.URL
		if u, err = url.Parse(ref.URI); err != nil {
			return nil, Info{}, fmt.Errorf("%w: %w", ErrUnsupportedSource, err)
		}
		if (u.Host != "" && u.Host != "localhost") || u.Path == "" {
			return nil, Info{}, fmt.Errorf("%w: %q: want file:///absolute/path", ErrUnsupportedSource, ref.URI)
		}
		w, info, err = loadLocal(ctx, filepath.FromSlash(u.Path), opts.Root)
	case hasScheme:
		return nil, Info{}, fmt.Errorf("%w: scheme %q (want a path, file://, http:// or https://)", ErrUnsupportedSource, scheme)
	default:
		w, info, err = loadLocal(ctx, ref.URI, opts.Root)
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("weights: version %d from %s: %w", ref.Version, RedactURI(ref.URI), err)
	}
	if ref.SHA256 != "" && !strings.EqualFold(ref.SHA256, info.Digest) {
		return nil, Info{}, fmt.Errorf("%w: version %d from %s: sha256 %s, want %s",
			ErrDigestMismatch, ref.Version, RedactURI(ref.URI), info.Digest, strings.ToLower(ref.SHA256))
	}
	return w, info, nil
}

// openerFor returns the opener and the path to open through it, applying root.
func openerFor(path, root string) (fileOpener, string, func(), error) {
	if root == "" {
		return osOpener{}, path, func() {}, nil
	}
	absRoot, err := filepath.Abs(root)
	if err != nil {
		return nil, "", nil, fmt.Errorf("%w: root: %w", ErrUnsupportedSource, err)
	}
	abs := path
	if !filepath.IsAbs(path) {
		abs = filepath.Join(absRoot, path)
	}
	rel, err := filepath.Rel(absRoot, filepath.Clean(abs))
	if err != nil || !filepath.IsLocal(rel) {
		return nil, "", nil, fmt.Errorf("%w: %s is outside the weights root %s", ErrUnsupportedSource, path, root)
	}
	r, err := os.OpenRoot(absRoot)
	if err != nil {
		return nil, "", nil, fmt.Errorf("%w: root: %w", ErrUnsupportedSource, err)
	}
	return r, rel, func() { r.Close() }, nil
}

// loadLocal loads a directory (HF) or a .bin file (llama2.c).
func loadLocal(ctx context.Context, path, root string) (*model.Weights, Info, error) {
	op, p, done, err := openerFor(path, root)
	if err != nil {
		return nil, Info{}, err
	}
	defer done()
	f, err := op.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// Perhaps not written yet: worth a retry, unlike the other failures.
			return nil, Info{}, fmt.Errorf("%w: %w", ErrFetch, err)
		}
		// Includes os.Root's refusal of paths that escape it through symlinks.
		return nil, Info{}, fmt.Errorf("%w: %w", ErrUnsupportedSource, err)
	}
	st, err := f.Stat()
	f.Close()
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %w", ErrUnsupportedSource, err)
	}
	switch {
	case st.IsDir():
		return loadHF(ctx, op, p)
	case st.Mode().IsRegular() && strings.HasSuffix(p, ".bin"):
		return loadLlama2C(ctx, op, p)
	}
	return nil, Info{}, fmt.Errorf("%w: %s is neither a checkpoint directory nor a llama2.c .bin file", ErrUnsupportedSource, path)
}

// loadHTTP downloads the checkpoint into a private temporary directory and loads that copy.
func loadHTTP(ctx context.Context, raw string, opts Options) (*model.Weights, Info, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %w", ErrUnsupportedSource, err)
	}
	dl := &downloader{client: opts.HTTPClient, left: opts.MaxDownloadBytes}
	if dl.client == nil {
		dl.client = NewHTTPClient(FetchPolicy{})
	}
	if dl.left <= 0 {
		dl.left = DefaultMaxDownloadBytes
	}
	dir, err := os.MkdirTemp(opts.TempDir, "rollout-weights-*")
	if err != nil {
		return nil, Info{}, fmt.Errorf("weights: %w", err)
	}
	defer os.RemoveAll(dir)

	if strings.HasSuffix(u.Path, ".bin") {
		p := filepath.Join(dir, "model.bin")
		if err := dl.get(ctx, u, p); err != nil {
			return nil, Info{}, err
		}
		return loadLlama2C(ctx, osOpener{}, p)
	}
	base := *u
	if !strings.HasSuffix(base.Path, "/") {
		base.Path += "/"
		base.RawPath = ""
	}
	at := func(name string) *url.URL { return base.ResolveReference(&url.URL{Path: name}) }
	if err := dl.getSmall(ctx, at(ConfigFile), filepath.Join(dir, ConfigFile)); err != nil {
		return nil, Info{}, err
	}
	err = dl.get(ctx, at(SafetensorsFile), filepath.Join(dir, SafetensorsFile))
	if errors.Is(err, errNotFound) {
		idxPath := filepath.Join(dir, IndexFile)
		if err := dl.getSmall(ctx, at(IndexFile), idxPath); err != nil {
			return nil, Info{}, err
		}
		idx, err := os.ReadFile(idxPath)
		if err != nil {
			return nil, Info{}, fmt.Errorf("weights: %w", err)
		}
		_, shards, err := parseIndex(idx)
		if err != nil {
			return nil, Info{}, err
		}
		for _, s := range shards {
			if err := dl.get(ctx, at(s), filepath.Join(dir, s)); err != nil {
				return nil, Info{}, err
			}
		}
	} else if err != nil {
		return nil, Info{}, err
	}
	return loadHF(ctx, osOpener{}, dir)
}

var errNotFound = fmt.Errorf("%w: 404 not found", ErrFetch)

// downloader fetches files under a shared byte budget.
type downloader struct {
	client *http.Client
	left   int64
}

// getSmall fetches a JSON file, which is also held to maxJSONBytes.
func (d *downloader) getSmall(ctx context.Context, u *url.URL, dst string) error {
	return d.fetch(ctx, u, dst, min(d.left, maxJSONBytes))
}

func (d *downloader) get(ctx context.Context, u *url.URL, dst string) error {
	return d.fetch(ctx, u, dst, d.left)
}

// fetch downloads u to dst, refusing more than limit bytes, and charges the budget.
func (d *downloader) fetch(ctx context.Context, u *url.URL, dst string, limit int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFetch, err)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrFetch, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%w: %s", errNotFound, u.Redacted())
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%w: %s: status %s", ErrFetch, u.Redacted(), resp.Status)
	case resp.ContentLength > limit:
		return fmt.Errorf("%w: %s: %d bytes exceeds the remaining download limit of %d", ErrFetch, u.Redacted(), resp.ContentLength, limit)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrFetch, u.Redacted(), err)
	}
	if n > limit {
		return fmt.Errorf("%w: %s: exceeds the download limit", ErrFetch, u.Redacted())
	}
	d.left -= n
	return nil
}

// Digest returns the hex SHA-256 digest of the checkpoint at path, as Load verifies it:
//
//   - a llama2.c .bin file: the SHA-256 of the file (what sha256sum prints);
//   - a Hugging Face directory: the SHA-256 of the sha256sum-style listing
//     "<hex sha256>  <name>\n" of config.json, then model.safetensors or, for a sharded
//     checkpoint, model.safetensors.index.json followed by every shard the index names in
//     sorted order. From a shell:
//     cd dir && sha256sum config.json model.safetensors | sha256sum
//
// config.json is covered because it changes the model as surely as the tensors do.
func Digest(ctx context.Context, path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("weights: digest: %w", err)
	}
	if !st.IsDir() {
		sum, err := hashFile(ctx, path)
		if err != nil {
			return "", err
		}
		return hex.EncodeToString(sum), nil
	}
	names := []string{ConfigFile, SafetensorsFile}
	if _, err := os.Stat(filepath.Join(path, SafetensorsFile)); errors.Is(err, fs.ErrNotExist) {
		idx, err := readSmall(osOpener{}, filepath.Join(path, IndexFile), maxJSONBytes)
		if err != nil {
			return "", fmt.Errorf("weights: digest: %w", err)
		}
		_, shards, err := parseIndex(idx)
		if err != nil {
			return "", err
		}
		names = append([]string{ConfigFile, IndexFile}, shards...)
	}
	sums := make([]fileSum, len(names))
	for i, n := range names {
		sum, err := hashFile(ctx, filepath.Join(path, n))
		if err != nil {
			return "", err
		}
		sums[i] = fileSum{n, sum}
	}
	return listingDigest(sums), nil
}

func hashFile(ctx context.Context, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("weights: digest: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, chunkBytes)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return h.Sum(nil), nil
		}
		if err != nil {
			return nil, fmt.Errorf("weights: digest %s: %w", path, err)
		}
	}
}
