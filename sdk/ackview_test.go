package sdk

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rolloutkit/rollout/sdk/protocol"
)

// A commit ack makes its server routable at once: the view takes the ack's version and
// digest together, so a server whose new heartbeat has not been read yet is a candidate at
// the desired version, beside one whose heartbeat has.
func TestCommitAckMakesItsServerRoutable(t *testing.T) {
	const sha = "aa11"
	c := &Client{refreshed: make(chan struct{}), view: map[string]*serverView{}}
	c.desired = &protocol.DesiredState{Epoch: 2, Weights: &protocol.WeightsRef{Version: 1, SHA256: sha}}
	old := protocol.Heartbeat{ServerID: "s1", State: protocol.StateRunning, InRotation: true, WeightVersion: 0, AdvertiseURL: "http://s1", At: 100}
	fresh := old
	fresh.ServerID, fresh.AdvertiseURL, fresh.WeightVersion, fresh.WeightSHA256, fresh.At = "s2", "http://s2", 1, sha, 300
	c.view["s1"] = &serverView{hb: old, live: true}
	c.view["s2"] = &serverView{hb: fresh, live: true}

	c.mu.Lock()
	cands, _, err := c.candidates(1, nil)
	c.mu.Unlock()
	require.NoError(t, err)
	require.Len(t, cands, 1, "before the ack only the server whose new heartbeat was read")

	c.noteAck(&protocol.Ack{ServerID: "s1", Kind: protocol.KindCommit, Result: protocol.ResultOK, WeightVersion: 1, WeightSHA256: sha, At: 200})
	c.mu.Lock()
	cands, _, err = c.candidates(1, nil)
	c.mu.Unlock()
	require.NoError(t, err)
	require.Len(t, cands, 2, "the acked server is routable before its heartbeat is read")
}
