package sdk

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestResultsJSON(t *testing.T) {
	b, err := json.Marshal(ServerResult{ServerID: "a", Result: "failed", Err: ErrFailed})
	require.NoError(t, err)
	assert.JSONEq(t, `{"server_id":"a","result":"failed","weight_version":0,"latency":0,"error":"sdk: failed on server"}`, string(b))
	b, err = json.Marshal(ServerUpdate{ServerID: "b", Err: ErrTimeout, Stage: &ServerResult{ServerID: "b"}})
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, "sdk: timeout", m["error"])
	assert.Equal(t, "b", m["stage"].(map[string]any)["server_id"])
}
