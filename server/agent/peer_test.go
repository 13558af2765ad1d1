package agent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// A stage command's assigned source must be a fleet member: a server whose heartbeat is
// missing or signed with another secret is refused (and counted), a verified one is used.
func TestStageChecksTheAssignedPeer(t *testing.T) {
	b := newMem(t)
	f := newFleet(t, b)
	n := startNode(t, b, nil)
	n.joined(f)
	hb, ok := f.heartbeat(serverID)
	require.True(t, ok)
	assert.Equal(t, n.URL()+"/weights", hb.PeerURL, "the heartbeat advertises the peer route")

	member := func(id string, secret []byte) {
		h := protocol.Heartbeat{V: protocol.Version, Fleet: fleetName, ServerID: id, State: protocol.StateRunning,
			PeerURL: "http://127.0.0.1:1/weights", At: time.Now().UnixMilli()}
		h.Sign(secret)
		raw, err := h.Encode()
		require.NoError(t, err)
		require.NoError(t, b.Set(t.Context(), f.names.Heartbeat(id), raw, time.Minute))
	}
	member("forged", []byte("another-secret-0123456789abcdef-0123456"))
	member("s2", testSecret)

	for i, c := range []struct {
		source  string
		refused bool
	}{{"ghost", true}, {"forged", true}, {"s2", false}} {
		ref := checkpoint(t, int64(2+i), uint64(10+i))
		a := f.do(protocol.Stage{Weights: ref, Sources: map[string]string{serverID: c.source}}, serverID)
		require.Equal(t, protocol.ResultOK, a.Result, a.Error)
		require.Len(t, a.Phases, 1)
		if c.refused {
			assert.Equal(t, int64(1), a.Phases[0].Detail["peer_refused"], c.source)
		} else {
			assert.NotContains(t, a.Phases[0].Detail, "peer_refused", c.source)
		}
		assert.Positive(t, a.Phases[0].Detail["origin_bytes"], "a file:// source comes from the origin")
	}
	_, text := n.get("/metrics")
	assert.Contains(t, text, `rollout_weights_source_failures_total{reason="not_member"} 2`)
	assert.True(t, strings.Contains(text, "rollout_peer_served_bytes_total 0"))
}
