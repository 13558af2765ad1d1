package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/sdk/protocol"
	"github.com/rolloutkit/rollout/weightstore"
)

// Route is the path prefix of the peer route: /weights/vN/<file>.
const Route = "/weights/"

// ErrBusy means Begin was asked for a version already being fetched.
var ErrBusy = errors.New("peer: version already being fetched")

// Config configures a Server.
type Config struct {
	// Dir holds the verified versions (a weightstore directory) and downloads in flight;
	// created when missing, emptied of stale downloads.
	Dir string
	// Fleet and Auth check the per-version tokens (protocol.PeerToken, the trainer's grants)
	// requests must carry; Secret stands for Auth when Auth is nil. With neither the route
	// takes none, as the rest of an unsigned fleet.
	Fleet  string
	Auth   *protocol.Auth
	Secret []byte
	Logger *slog.Logger
	// BeginWait bounds how long a request for a version the server neither holds nor
	// fetches waits for its fetch to begin (default DefaultBeginWait).
	BeginWait time.Duration
}

// auth is Auth, or the Auth of Secret.
func (c *Config) auth() *protocol.Auth {
	if c.Auth != nil {
		return c.Auth
	}
	return protocol.SecretAuth(c.Secret)
}

// Server is a rollout server's peer side: the versions it holds, served read-only, and the
// version it is fetching, relayed to its children as the bytes arrive (each child verifies
// every byte against the digest before it uses any, as this server does).
type Server struct {
	cfg    Config
	store  *weightstore.Store
	mu     sync.Mutex
	relays map[int64]*relay
	begun  chan struct{} // closed and replaced when a fetch begins
	served atomic.Int64
}

// DefaultBeginWait bounds how long the route waits for a fetch of a version it neither holds
// nor fetches yet: every server gets the same stage command at about the same time, so a
// child's request can come a moment before its parent has begun. Shorter than a fetcher's
// weights.DefaultHeaderTimeout, so the child still moves on by itself.
const DefaultBeginWait = weights.DefaultHeaderTimeout / 3

// New opens (creating) the store in cfg.Dir.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BeginWait <= 0 {
		cfg.BeginWait = DefaultBeginWait
	}
	cfg.Auth = cfg.auth() // derived once: a check per request must not derive the key
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	stale, _ := filepath.Glob(filepath.Join(cfg.Dir, ".fetch-*"))
	for _, d := range stale {
		_ = os.RemoveAll(d)
	}
	st, err := weightstore.Open(ctx, cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("peer: %w", err)
	}
	return &Server{cfg: cfg, store: st, relays: map[int64]*relay{}, begun: make(chan struct{})}, nil
}

// Holds lists the versions the server serves to peers, oldest first.
func (s *Server) Holds() []int64 {
	var out []int64
	for _, e := range s.store.Versions() {
		out = append(out, e.Version)
	}
	return out
}

// ServedBytes is what the route has sent peers.
func (s *Server) ServedBytes() int64 { return s.served.Load() + s.store.BytesServed() }

// Keep removes every held version but those listed (the serving and the staged one).
func (s *Server) Keep(versions ...int64) {
	for _, v := range s.Holds() {
		if !slices.Contains(versions, v) {
			if err := s.store.Remove(v); err != nil {
				s.cfg.Logger.Warn("peer: cannot remove an old version", "version", v, "err", err)
			}
		}
	}
}

// Fetch is one version being fetched: weights.Load writes it to Dir (Options.KeepDir) and
// reports its progress to Observe, which lets the route relay it; End adopts or drops it.
type Fetch struct {
	s   *Server
	v   int64
	sha string
	Dir string
	r   *relay
}

// Begin registers the fetch of version v with digest sha.
func (s *Server) Begin(v int64, sha string) (*Fetch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.relays[v]; busy {
		return nil, fmt.Errorf("%w: %d", ErrBusy, v)
	}
	r := &relay{sha: sha, files: map[string]*relayFile{}, wake: make(chan struct{})}
	s.relays[v] = r
	close(s.begun)
	s.begun = make(chan struct{})
	dir := filepath.Join(s.cfg.Dir, ".fetch-"+weightstore.VersionDir(v)+"-"+protocol.NewID()[:8])
	return &Fetch{s: s, v: v, sha: sha, Dir: dir, r: r}, nil
}

// Observe is the fetch's weights.Options.Observe.
func (f *Fetch) Observe(_ context.Context, e weights.FetchEvent) {
	r := f.r
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case weights.EventBytes:
		rf := r.files[e.File]
		if rf == nil {
			rf = &relayFile{path: filepath.Join(f.Dir, e.File)}
			r.files[e.File] = rf
		}
		rf.written, rf.size = e.Written, e.Size
	case weights.EventRestart:
		if rf := r.files[e.File]; rf != nil {
			rf.gen++
			rf.written = 0
		}
	case weights.EventDigestMismatch:
		// Everything is fetched again: what was relayed is void.
		for _, rf := range r.files {
			rf.gen++
			rf.written = 0
		}
	default:
		return
	}
	r.broadcast()
}

// End finishes the fetch: a verified one (ok) is adopted into the store, which hashes it once
// more before serving it; otherwise the download is removed. Relays in progress then continue
// from the store or are cut off.
func (f *Fetch) End(ctx context.Context, ok bool) error {
	var err error
	if ok {
		_, err = f.s.store.Adopt(ctx, f.v, f.Dir, f.sha)
	} else {
		_ = os.RemoveAll(f.Dir)
	}
	f.s.mu.Lock()
	delete(f.s.relays, f.v)
	f.s.mu.Unlock()
	f.r.mu.Lock()
	f.r.ended, f.r.ok = true, ok && err == nil
	f.r.broadcast()
	f.r.mu.Unlock()
	return err
}

// relay is the state of a fetch in flight, for the route.
type relay struct {
	sha       string
	mu        sync.Mutex
	files     map[string]*relayFile
	ended, ok bool
	wake      chan struct{} // closed and replaced on every change
}

type relayFile struct {
	path          string
	written, size int64
	gen           int
}

func (r *relay) broadcast() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// Handler serves Route: GET or HEAD /weights/vN/<file> of a version the server holds (from the
// store, with Range support) or is fetching (relayed as it arrives), with the version's token.
// A version the server neither holds nor fetches answers 503, so the fetcher moves on to its
// next source.
func (s *Server) Handler() http.Handler {
	inner := http.StripPrefix(strings.TrimSuffix(Route, "/"), s.store.Handler())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			httpError(w, http.StatusMethodNotAllowed, "method_not_allowed", "GET or HEAD")
			return
		}
		dir, file, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, Route), "/")
		v, err := strconv.ParseInt(strings.TrimPrefix(dir, "v"), 10, 64)
		if !strings.HasPrefix(dir, "v") || err != nil || v < 0 || file == "" || strings.Contains(file, "/") {
			httpError(w, http.StatusNotFound, "not_found", "want "+Route+"vN/<file>")
			return
		}
		rel := s.waitRelay(r.Context(), v)
		sha := ""
		if e, err := s.store.Get(v); err == nil {
			sha = e.SHA256
		} else if rel == nil {
			httpError(w, http.StatusServiceUnavailable, "not_held", "this server neither holds nor fetches version "+strconv.FormatInt(v, 10))
			return
		} else {
			sha = rel.sha
		}
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !s.cfg.auth().CheckPeerGrant(s.cfg.Fleet, v, sha, tok) {
			httpError(w, http.StatusUnauthorized, "unauthorized", "a peer token for this version is required")
			return
		}
		if rel != nil && s.relayFile(w, r, rel, file) {
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// waitRelay returns the fetch of v in flight, waiting up to Config.BeginWait for one to begin when
// the server does not hold v either (nil: none).
func (s *Server) waitRelay(ctx context.Context, v int64) *relay {
	timer := time.NewTimer(s.cfg.BeginWait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		rel, begun := s.relays[v], s.begun
		s.mu.Unlock()
		if rel != nil {
			return rel
		}
		if _, err := s.store.Get(v); err == nil {
			return nil
		}
		select {
		case <-begun:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// relayFile streams file of a fetch in flight as it is written, from the Range start when
// one is asked. It returns false when the fetch has ended meanwhile with the version
// adopted, for the store to serve it instead.
func (s *Server) relayFile(w http.ResponseWriter, r *http.Request, rel *relay, name string) bool {
	ctx := r.Context()
	// Wait for the file to appear (or the fetch to end).
	var rf relayFile
	for {
		rel.mu.Lock()
		f, ended, ok, wake := rel.files[name], rel.ended, rel.ok, rel.wake
		if f != nil {
			rf = *f
		}
		rel.mu.Unlock()
		switch {
		case ended && ok:
			return false
		case ended:
			httpError(w, http.StatusServiceUnavailable, "fetch_failed", "this server's fetch of the version failed")
			return true
		case f != nil && rf.size >= 0:
		default:
			if !waitFor(ctx, wake) {
				return true
			}
			continue
		}
		break
	}
	off := int64(0)
	if rg := r.Header.Get("Range"); rg != "" {
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(rg, "bytes="), "-"), 10, 64)
		if err != nil || n < 0 || n > rf.size || !strings.HasSuffix(rg, "-") {
			httpError(w, http.StatusRequestedRangeNotSatisfiable, "bad_range", "only bytes=N- ranges are served while relaying")
			return true
		}
		off = n
	}
	fh, err := os.Open(rf.path)
	if err != nil {
		// The fetch ended in between: End moved the download into the store before it marks
		// the relay ended. Wait for that mark, then serve from the store.
		for {
			rel.mu.Lock()
			ended, ok, wake := rel.ended, rel.ok, rel.wake
			rel.mu.Unlock()
			if ended && ok {
				return false
			}
			if ended || !waitFor(ctx, wake) {
				httpError(w, http.StatusServiceUnavailable, "fetch_failed", "this server's fetch of the version failed")
				return true
			}
		}
	}
	defer fh.Close()
	w.Header().Set("Content-Length", strconv.FormatInt(rf.size-off, 10))
	w.Header().Set("Accept-Ranges", "bytes")
	if off > 0 {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, rf.size-1, rf.size))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	if r.Method == http.MethodHead {
		return true
	}
	gen, pos := rf.gen, off
	buf := make([]byte, 1<<20)
	fl, _ := w.(http.Flusher)
	for pos < rf.size {
		rel.mu.Lock()
		f, ended, ok, wake := rel.files[name], rel.ended, rel.ok, rel.wake
		written, fgen := f.written, f.gen
		rel.mu.Unlock()
		if fgen != gen || ended && !ok {
			// The bytes sent so far are void (the fetch restarted or failed): break the
			// response so the child resumes elsewhere and its digest check catches the rest.
			panic(http.ErrAbortHandler)
		}
		if ended && ok {
			written = rf.size // the whole file is on disk
		}
		if written <= pos {
			if !waitFor(ctx, wake) {
				return true
			}
			continue
		}
		for pos < written {
			n, err := fh.ReadAt(buf[:min(int64(len(buf)), written-pos)], pos)
			if n > 0 {
				m, werr := w.Write(buf[:n])
				s.served.Add(int64(m))
				if werr != nil {
					return true
				}
				pos += int64(n)
			}
			if err != nil && !errors.Is(err, io.EOF) {
				panic(http.ErrAbortHandler)
			}
			if n == 0 {
				break
			}
		}
		if fl != nil {
			fl.Flush()
		}
	}
	return true
}

func waitFor(ctx context.Context, wake <-chan struct{}) bool {
	select {
	case <-wake:
		return true
	case <-ctx.Done():
		return false
	}
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"error":{"type":"peer","code":%q,"message":%q}}`+"\n", code, msg)
}
