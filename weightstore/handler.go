package weightstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/sdk/protocol"
)

// Handler serves the store over HTTP (GET and HEAD):
//
//   - / and /index.json: the Index of all versions with their digests (rescanning the
//     directory first, so versions other processes published appear);
//   - /vN/: version N's Entry as JSON;
//   - /vN/<file>: one of version N's checkpoint files (only the files its digest covers).
//
// weights.Load with the URI http://host/vN/ fetches config.json and model.safetensors (or the
// index and its shards) from here.
func (s *Store) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		p := r.URL.Path
		if p == "/" || p == "/index.json" {
			if err := s.Refresh(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			idx := Index{Versions: s.Versions(), Latest: -1}
			if n := len(idx.Versions); n > 0 {
				idx.Latest = idx.Versions[n-1].Version
			}
			writeJSON(w, idx)
			return
		}
		dir, file, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
		v, ok := parseVersionDir(dir)
		if !ok || strings.Contains(file, "/") {
			http.NotFound(w, r)
			return
		}
		e, err := s.Get(v)
		if errors.Is(err, ErrNotFound) {
			// Possibly published by another process since the last scan.
			if rerr := s.Refresh(r.Context()); rerr == nil {
				e, err = s.Get(v)
			}
		}
		if err != nil {
			http.NotFound(w, r)
			return
		}
		if file == "" {
			writeJSON(w, e)
			return
		}
		if !slices.Contains(e.Files, file) {
			http.NotFound(w, r)
			return
		}
		s.serveFile(w, r, path.Join(dir, file))
	})
}

// serveFile serves name (relative to the store) through an os.Root, so a symlink inside a
// version cannot lead out of the store.
func (s *Store) serveFile(w http.ResponseWriter, r *http.Request, name string) {
	root, err := os.OpenRoot(s.dir)
	if err != nil {
		http.Error(w, "store unavailable", http.StatusInternalServerError)
		return
	}
	defer root.Close()
	f, err := root.Open(name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	http.ServeContent(&countingWriter{ResponseWriter: w, n: &s.served}, r, path.Base(name), st.ModTime(), f)
}

// countingWriter counts the body bytes written through it.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

// Write counts p before writing it, and takes back what did not go out: counted after, a
// client could hold every byte before the count did (what a test reads right after its GET).
func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	n, err := c.ResponseWriter.Write(p)
	if n < len(p) {
		c.n.Add(int64(n - len(p)))
	}
	return n, err
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// Handler opens the store in dir and returns its HTTP handler: what `rollout weights serve
// DIR` mounts.
func Handler(ctx context.Context, dir string) (http.Handler, error) {
	s, err := Open(ctx, dir)
	if err != nil {
		return nil, err
	}
	return s.Handler(), nil
}

// Server serves a Store on a TCP listener.
type Server struct {
	store *Store
	ln    net.Listener
	srv   *http.Server
	done  chan error
}

// Serve listens on addr ("127.0.0.1:0" picks a free port) and serves store until Close.
func Serve(addr string, store *Store) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("weightstore: %w", err)
	}
	sv := &Server{store: store, ln: ln, done: make(chan error, 1),
		srv: &http.Server{Handler: store.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	go func() { sv.done <- sv.srv.Serve(ln) }()
	return sv, nil
}

// URL is the server's base URL, http://host:port.
func (sv *Server) URL() string { return "http://" + sv.ln.Addr().String() }

// Ref is the ref of version v on this server (see Store.Ref). Errors: ErrNotFound.
func (sv *Server) Ref(v int64) (protocol.WeightsRef, error) { return sv.store.Ref(sv.URL(), v) }

// Publish publishes w as version v in the server's store, unless it holds v already, and
// returns its ref on this server (see Store.PublishRef): trained weights to the argument of
// sdk.Client.UpdateWeights in one call.
func (sv *Server) Publish(ctx context.Context, v int64, w *model.Weights) (protocol.WeightsRef, error) {
	return sv.store.PublishRef(ctx, sv.URL(), v, w)
}

// Close stops the server, letting in-flight downloads finish until ctx ends.
func (sv *Server) Close(ctx context.Context) error {
	err := sv.srv.Shutdown(ctx)
	if serr := <-sv.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
