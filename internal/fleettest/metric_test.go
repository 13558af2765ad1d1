package fleettest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSumMetric(t *testing.T) {
	text := `# HELP rollout_control_rejected_total Commands refused.
# TYPE rollout_control_rejected_total counter
rollout_control_rejected_total{reason="unsigned"} 2
rollout_control_rejected_total{reason="bad_signature"} 3
rollout_control_rejected_total_other 100
rollout_offload_resets_total 4
rollout_control_commands_total{kind="pause",result="ok"} 1
rollout_control_commands_total{kind="commit",result="ok"} 5
rollout_control_commands_total{kind="commit",result="failed"} 1
`
	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"rollout_control_rejected_total", nil, 5},
		{"rollout_control_rejected_total", []string{"reason", "unsigned"}, 2},
		{"rollout_control_rejected_total", []string{"reason", "replayed"}, 0},
		{"rollout_offload_resets_total", nil, 4},
		{"rollout_control_commands_total", []string{"kind", "commit"}, 6},
		{"rollout_control_commands_total", []string{"kind", "commit", "result", "ok"}, 5},
		{"rollout_missing", nil, 0},
	} {
		got, err := SumMetric(strings.NewReader(text), tt.name, tt.labels...)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "%s %v", tt.name, tt.labels)
	}
	_, err := SumMetric(strings.NewReader(text), "x", "odd")
	assert.Error(t, err)
	_, err = SumMetric(strings.NewReader("m{a=\"b\"} notanumber\n"), "m")
	assert.Error(t, err)
}
