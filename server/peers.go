package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/rolloutkit/rollout/engine/weights"
	"github.com/rolloutkit/rollout/server/agent"
	"github.com/rolloutkit/rollout/server/api"
	"github.com/rolloutkit/rollout/server/peer"
)

// startPeer opens the peer route's store and counts what it serves.
func (s *Server) startPeer() error {
	dir := s.cfg.PeerDir
	if dir == "" {
		d, err := os.MkdirTemp("", "rollout-peer-*")
		if err != nil {
			return fmt.Errorf("server: peer directory: %w", err)
		}
		dir, s.peerTmp = d, d
	}
	p, err := peer.New(context.Background(), peer.Config{Dir: dir, Fleet: s.cfg.Fleet, Auth: s.auth, Logger: s.log})
	if err != nil {
		s.removePeerDir()
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s.peer = p
	err = s.api.Metrics().Registry().Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "rollout_peer_served_bytes_total",
		Help: "Checkpoint bytes this server sent its peers from its /weights/ route."}, func() float64 { return float64(p.ServedBytes()) }))
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}

func (s *Server) removePeerDir() {
	if s.peerTmp != "" {
		_ = os.RemoveAll(s.peerTmp)
	}
}

// handler is the API's handler with the peer route in front: the route streams whole
// checkpoints, so it is outside the API's per-write deadlines and request limits (its token
// is its guard).
func (s *Server) handler() http.Handler {
	h := s.api.Handler()
	if s.peer == nil {
		return h
	}
	ph := s.peer.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, peer.Route) {
			ph.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// stagePeers fetches req's version from its assigned peer first, then the origin, keeping the
// verified download for this server's own peers and relaying it to them while it arrives.
func (s *Server) stagePeers(ctx context.Context, req agent.StageRequest, m *api.Metrics) (agent.StageReport, error) {
	var rep agent.StageReport
	if req.PeerRefused != nil {
		m.SourceFailed(api.FailNotMember)
		rep.SourceFailures++
	}
	ref := weights.Ref{Version: req.Ref.Version, URI: req.Ref.URI, SHA256: req.Ref.SHA256}
	f, err := s.peer.Begin(ref.Version, ref.SHA256)
	if err != nil || !weights.IsHTTP(ref.URI) || strings.HasSuffix(ref.URI, ".bin") {
		// Only http(s) Hugging Face checkpoints travel between peers (a peer serves what
		// its weight store holds); the rest come from the origin.
		if err == nil {
			_ = f.End(ctx, false)
		}
		n, err := s.api.StageWeights(ctx, ref)
		rep.OriginBytes = n
		return rep, err
	}
	observe := func(ctx context.Context, e weights.FetchEvent) {
		f.Observe(ctx, e)
		span := trace.SpanFromContext(ctx)
		switch e.Kind {
		case weights.EventBytes:
			if e.Peer {
				rep.PeerBytes += e.Bytes
				m.Fetched(api.SourcePeer, e.Bytes)
			} else {
				rep.OriginBytes += e.Bytes
				m.Fetched(api.SourceOrigin, e.Bytes)
			}
		case weights.EventSourceFailed:
			rep.SourceFailures++
			reason := api.FailDied
			if e.File == "" {
				reason = api.FailBadDigest
			}
			m.SourceFailed(reason)
			span.AddEvent("weights.source_replaced", trace.WithAttributes(attribute.String("rollout.source", e.Source),
				attribute.Bool("rollout.peer", e.Peer), attribute.String("rollout.reason", reason), attribute.String("rollout.file", e.File),
				attribute.Bool("rollout.resumed", e.Resumed), attribute.String("rollout.error", errString(e.Err))))
			s.log.Warn("server: weight source replaced", "version", ref.Version, "source", e.Source, "peer", e.Peer, "reason", reason,
				"file", e.File, "resumed", e.Resumed, "err", e.Err)
		}
	}
	tweak := func(o *weights.Options) {
		o.KeepDir, o.Observe = f.Dir, observe
		if p := req.Peer; p != nil {
			o.Mirrors = []weights.Mirror{{URL: strings.TrimSuffix(p.URL, "/") + "/v" + strconv.FormatInt(ref.Version, 10) + "/",
				Header: http.Header{"Authorization": {"Bearer " + req.Grant}}}}
		}
	}
	_, err = s.api.StageWeightsWith(ctx, ref, tweak)
	if eerr := f.End(context.WithoutCancel(ctx), err == nil); eerr != nil && err == nil {
		// Staged, but not servable to peers: they fetch elsewhere.
		s.log.Warn("server: staged weights cannot be served to peers", "version", ref.Version, "err", eerr)
	}
	s.peer.Keep(s.eng.Metrics().WeightVersion, ref.Version)
	if errors.Is(err, weights.ErrDigestMismatch) {
		m.SourceFailed(api.FailBadDigest)
	}
	return rep, err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
