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
	"path"
	"path/filepath"
	"strconv"
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
	// KeepDir, when set, is the directory (it must not exist yet) an http(s) download is
	// written to and left in after a verified load, for the caller to serve; it is removed
	// when the load fails.
	KeepDir string
	// Mirrors are tried before an http(s) ref's URI, in order (see Mirror).
	Mirrors []Mirror
	// Observe receives the progress of an http(s) fetch (nil: none); it runs on the
	// fetching goroutine.
	Observe func(ctx context.Context, e FetchEvent)
	// Reuse, when set, is a weight set the caller owns and nothing reads any more (not
	// served, not staged, no copy in progress): each tensor of the load whose name and length
	// match one of Reuse's is decoded into that tensor's memory instead of a new allocation,
	// the others are allocated. On success the result shares that memory, so Reuse must not
	// be used again (use the result). On failure (digest mismatch, truncated or bad data, a
	// cancelled context) Reuse's contents are undefined and it must not be used at all. The
	// digest is still computed over the bytes parsed and checked before the result is
	// returned, so nobody can use unverified tensors. It saves the page faults of fresh
	// memory, which made a steady-state load several times slower than hashing the file.
	Reuse *model.Weights
	// Sink, when set, receives the tensors instead of a weight set, and Load returns nil
	// weights: a Hugging Face checkpoint's tensors one at a time as they are decoded, each
	// into memory the sink gives (so a bf16 checkpoint never exists as a float32 set), a
	// llama2.c one's once it is loaded and verified. The sink sees a tensor before the
	// digest is checked, so on failure whatever it built must be discarded. Reuse is
	// ignored.
	Sink Sink
}

// Sink receives a checkpoint's tensors one at a time by their Hugging Face names, as
// model.Builder does. SetConfig gets the checkpoint's configuration before any tensor (an
// error refuses the checkpoint), Buffer gives memory for n values, and Put takes over a
// tensor's finite values in that memory (an error, such as a tensor the model does not
// have or of another size, refuses the checkpoint).
type Sink interface {
	SetConfig(c model.Config) error
	Buffer(n int) []float32
	Put(name string, v []float32) error
}

// feed puts every tensor of w into sink (a llama2.c checkpoint, which is loaded whole).
func feed(w *model.Weights, sink Sink) error {
	if err := sink.SetConfig(w.Config); err != nil {
		return fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	for _, t := range w.Tensors() {
		buf := sink.Buffer(len(*t.Data))
		copy(buf, *t.Data)
		if err := sink.Put(t.Name, buf); err != nil {
			return fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
		}
	}
	return nil
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
		w, info, err = loadHTTP(ctx, ref.URI, ref.SHA256, opts)
		err = publicFetchError(ctx, ref.URI, err)
	case hasScheme && s == "file":
		var u *url.URL
		if u, err = url.Parse(ref.URI); err != nil {
			return nil, Info{}, fmt.Errorf("%w: %w", ErrUnsupportedSource, err)
		}
		if (u.Host != "" && u.Host != "localhost") || u.Path == "" {
			return nil, Info{}, fmt.Errorf("%w: %q: want file:///absolute/path", ErrUnsupportedSource, ref.URI)
		}
		w, info, err = loadLocal(ctx, filepath.FromSlash(u.Path), opts.Root, opts.Reuse, opts.Sink)
	case hasScheme:
		return nil, Info{}, fmt.Errorf("%w: scheme %q (want a path, file://, http:// or https://)", ErrUnsupportedSource, scheme)
	default:
		w, info, err = loadLocal(ctx, ref.URI, opts.Root, opts.Reuse, opts.Sink)
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("weights: version %d from %s: %w", ref.Version, RedactURI(ref.URI), err)
	}
	if ref.SHA256 != "" && !strings.EqualFold(ref.SHA256, info.Digest) {
		return nil, Info{}, fmt.Errorf("%w: version %d from %s: sha256 %s, want %s",
			ErrDigestMismatch, ref.Version, RedactURI(ref.URI), info.Digest, strings.ToLower(ref.SHA256))
	}
	if opts.Sink != nil && w != nil {
		if err := feed(w, opts.Sink); err != nil {
			return nil, Info{}, fmt.Errorf("weights: version %d from %s: %w", ref.Version, RedactURI(ref.URI), err)
		}
		w = nil
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

// loadLocal loads a directory (HF) or a .bin file (llama2.c), into reuse where it fits.
func loadLocal(ctx context.Context, path, root string, reuse *model.Weights, sink Sink) (*model.Weights, Info, error) {
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
		return loadHF(ctx, op, p, reuse, sink)
	case st.Mode().IsRegular() && strings.HasSuffix(p, ".bin"):
		return loadLlama2C(ctx, op, p, reuse)
	}
	return nil, Info{}, fmt.Errorf("%w: %s is neither a checkpoint directory nor a llama2.c .bin file", ErrUnsupportedSource, path)
}

// loadHTTP downloads the checkpoint into a private temporary directory (or opts.KeepDir) and
// loads that copy. The sources are opts.Mirrors, then raw (the origin): a file whose download
// breaks resumes from the next source (HTTP Range, or from its start when that source ignores
// ranges), and a checkpoint whose digest is not sha is fetched again, from scratch, from the
// next source; only when every source has failed is the last error returned.
func loadHTTP(ctx context.Context, raw, sha string, opts Options) (*model.Weights, Info, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: %w", ErrUnsupportedSource, err)
	}
	srcs := make([]source, 0, len(opts.Mirrors)+1)
	for _, m := range opts.Mirrors {
		mu, err := url.Parse(m.URL)
		if err != nil || !IsHTTP(m.URL) {
			return nil, Info{}, fmt.Errorf("%w: mirror %q", ErrUnsupportedSource, RedactURI(m.URL))
		}
		srcs = append(srcs, source{base: mu, header: m.Header, peer: true})
	}
	srcs = append(srcs, source{base: u})
	dl := &downloader{client: opts.HTTPClient, limit: opts.MaxDownloadBytes, srcs: srcs, observe: opts.Observe, reuse: opts.Reuse, sink: opts.Sink}
	if dl.client == nil {
		dl.client = NewHTTPClient(FetchPolicy{})
	}
	if dl.limit <= 0 {
		dl.limit = DefaultMaxDownloadBytes
	}
	dir := opts.KeepDir
	if dir == "" {
		if dir, err = os.MkdirTemp(opts.TempDir, "rollout-weights-*"); err != nil {
			return nil, Info{}, fmt.Errorf("weights: %w", err)
		}
		defer os.RemoveAll(dir)
	} else if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, Info{}, fmt.Errorf("weights: %w", err)
	}
	for {
		w, info, err := dl.attempt(ctx, u, dir)
		if err == nil && sha != "" && !strings.EqualFold(sha, info.Digest) {
			err = fmt.Errorf("%w: sha256 %s, want %s", ErrDigestMismatch, info.Digest, strings.ToLower(sha))
			dl.event(ctx, FetchEvent{Kind: EventDigestMismatch, Err: err})
		}
		if err == nil {
			return w, info, nil
		}
		// A bad checkpoint (bytes that do not parse or hash right) is the source's fault
		// too: start again from the next one. A refused address or a cancelled fetch is not.
		if ctx.Err() != nil || dl.cur+1 >= len(dl.srcs) || !(errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrBadCheckpoint)) {
			if opts.KeepDir != "" {
				_ = os.RemoveAll(dir)
			}
			if errors.Is(err, ErrDigestMismatch) && len(dl.srcs) > 1 {
				err = fmt.Errorf("%w (from every one of %d sources)", err, len(dl.srcs))
			}
			return nil, Info{}, err
		}
		dl.failover(ctx, "", err)
		if err := clearDir(dir); err != nil {
			return nil, Info{}, err
		}
		dl.left = dl.limit
	}
}

// attempt downloads every file of the checkpoint at u's layout (from the current source on)
// into dir and loads it.
func (d *downloader) attempt(ctx context.Context, u *url.URL, dir string) (*model.Weights, Info, error) {
	d.left = d.limit
	if strings.HasSuffix(u.Path, ".bin") {
		name := path.Base(u.Path)
		p := filepath.Join(dir, "model.bin")
		if err := d.get(ctx, name, p, d.left); err != nil {
			return nil, Info{}, err
		}
		return loadLlama2C(ctx, osOpener{}, p, d.reuse)
	}
	if err := d.get(ctx, ConfigFile, filepath.Join(dir, ConfigFile), min(d.left, maxJSONBytes)); err != nil {
		return nil, Info{}, err
	}
	err := d.get(ctx, SafetensorsFile, filepath.Join(dir, SafetensorsFile), d.left)
	if errors.Is(err, errNotFound) {
		idxPath := filepath.Join(dir, IndexFile)
		if err := d.get(ctx, IndexFile, idxPath, min(d.left, maxJSONBytes)); err != nil {
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
			if err := d.get(ctx, s, filepath.Join(dir, s), d.left); err != nil {
				return nil, Info{}, err
			}
		}
	} else if err != nil {
		return nil, Info{}, err
	}
	return loadHF(ctx, osOpener{}, dir, d.reuse, d.sink)
}

func clearDir(dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	for _, de := range des {
		if err := os.RemoveAll(filepath.Join(dir, de.Name())); err != nil {
			return fmt.Errorf("weights: %w", err)
		}
	}
	return nil
}

var errNotFound = fmt.Errorf("%w: 404 not found", ErrFetch)

// Mirror is a source tried before a ref's URI: the base URL of the same checkpoint's files
// (a peer server's /weights/vN/), with the headers its requests carry (its token).
type Mirror struct {
	URL    string
	Header http.Header
}

// Kinds of FetchEvent.
const (
	// EventBytes: Bytes more bytes of File were written (Written in all), from a peer or the
	// origin; Size is the file's length when known.
	EventBytes = "bytes"
	// EventRestart: File starts again from its first byte (a source ignored a Range
	// request, or a fresh attempt began): what was written of it is void.
	EventRestart = "restart"
	// EventSourceFailed: a source died or answered wrongly; the fetch goes on from the next.
	EventSourceFailed = "source_failed"
	// EventDigestMismatch: the whole checkpoint did not hash to the digest.
	EventDigestMismatch = "digest_mismatch"
)

// FetchEvent reports the progress of an http(s) fetch to Options.Observe.
type FetchEvent struct {
	Kind string
	// Source is the redacted base URL of the source involved; Peer says it is a mirror.
	Source string
	Peer   bool
	File   string
	// Bytes is the increment of an EventBytes, Written the file's bytes so far, Size its
	// length (-1: unknown).
	Bytes, Written, Size int64
	// Resumed says an EventSourceFailed's file continues with a Range request elsewhere.
	Resumed bool
	Err     error
}

// source is one place the checkpoint's files can be fetched from.
type source struct {
	base   *url.URL
	header http.Header
	peer   bool
}

// downloader fetches files under a shared byte budget, from srcs[cur] on.
type downloader struct {
	client      *http.Client
	limit, left int64
	srcs        []source
	cur         int
	observe     func(context.Context, FetchEvent)
	// reuse is Options.Reuse; an attempt that fails leaves it undefined, which the next
	// attempt overwrites anyway.
	reuse *model.Weights
	sink  Sink
}

func (d *downloader) event(ctx context.Context, e FetchEvent) {
	if d.observe != nil {
		d.observe(ctx, e)
	}
}

// failover moves on to the next source after err (on file, "" for the whole checkpoint).
func (d *downloader) failover(ctx context.Context, file string, err error) {
	s := d.srcs[d.cur]
	d.cur++
	d.event(ctx, FetchEvent{Kind: EventSourceFailed, Source: RedactURI(s.base.String()), Peer: s.peer, File: file, Resumed: file != "", Err: err})
}

// get downloads file name to dst, refusing more than limit bytes, and charges the budget. A
// source that fails midway is replaced by the next, which continues where it stopped.
func (d *downloader) get(ctx context.Context, name, dst string, limit int64) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("weights: %w", err)
	}
	defer f.Close()
	var written int64
	for {
		pos, err := d.fetch(ctx, name, f, written, limit)
		written = pos
		if err == nil {
			d.left -= written
			return f.Close()
		}
		// A 404 answers the question (the file is not part of this checkpoint); the other
		// failures are the source's.
		if errors.Is(err, errNotFound) || ctx.Err() != nil || errors.Is(err, ErrAddressRefused) && !d.srcs[d.cur].peer || d.cur+1 >= len(d.srcs) {
			_ = f.Close()
			_ = os.Remove(dst) // no file rather than a partial one the loader would read
			return err
		}
		d.failover(ctx, name, err)
	}
}

// fetch appends name from the current source to f, which holds off bytes of it already
// (asking for the rest with a Range request), and returns how many bytes f holds after it.
func (d *downloader) fetch(ctx context.Context, name string, f *os.File, off, limit int64) (int64, error) {
	s := d.srcs[d.cur]
	u := s.base.ResolveReference(&url.URL{Path: name})
	if strings.HasSuffix(s.base.Path, ".bin") {
		u = s.base
	} else if !strings.HasSuffix(s.base.Path, "/") {
		b := *s.base
		b.Path += "/"
		b.RawPath = ""
		u = b.ResolveReference(&url.URL{Path: name})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrFetch, err)
	}
	for k, v := range s.header {
		req.Header[k] = v
	}
	if off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-")
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrFetch, err)
	}
	defer resp.Body.Close()
	size := int64(-1)
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return 0, fmt.Errorf("%w: %s", errNotFound, u.Redacted())
	case off > 0 && resp.StatusCode == http.StatusPartialContent:
		if resp.ContentLength >= 0 {
			size = off + resp.ContentLength
		}
	case resp.StatusCode == http.StatusOK:
		if off > 0 {
			// The source ignores ranges: start this file again.
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return 0, fmt.Errorf("weights: %w", err)
			}
			if err := f.Truncate(0); err != nil {
				return 0, fmt.Errorf("weights: %w", err)
			}
			d.event(ctx, FetchEvent{Kind: EventRestart, File: name})
			off = 0
		}
		size = resp.ContentLength
	default:
		return 0, fmt.Errorf("%w: %s: status %s", ErrFetch, u.Redacted(), resp.Status)
	}
	if size > limit {
		return 0, fmt.Errorf("%w: %s: %d bytes exceeds the remaining download limit of %d", ErrFetch, u.Redacted(), size, limit)
	}
	cw := &countWriter{w: f, emit: func(e FetchEvent) { d.event(ctx, e) }, file: name, peer: s.peer, written: off, size: size}
	_, err = io.Copy(cw, io.LimitReader(resp.Body, limit-off+1))
	switch {
	case err != nil:
		return cw.written, fmt.Errorf("%w: %s: %w", ErrFetch, u.Redacted(), err)
	case cw.written > limit:
		return cw.written, fmt.Errorf("%w: %s: exceeds the download limit", ErrFetch, u.Redacted())
	case size >= 0 && cw.written != size:
		return cw.written, fmt.Errorf("%w: %s: %d of %d bytes", ErrFetch, u.Redacted(), cw.written, size)
	}
	return cw.written, nil
}

// countWriter writes a download and reports each write.
type countWriter struct {
	w       io.Writer
	emit    func(FetchEvent)
	file    string
	peer    bool
	written int64
	size    int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if n > 0 {
		c.written += int64(n)
		c.emit(FetchEvent{Kind: EventBytes, Peer: c.peer, File: c.file, Bytes: int64(n), Written: c.written, Size: c.size})
	}
	return n, err
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
