package faults

import (
	"os"
	"strings"
	"testing"

	"github.com/rolloutkit/rollout/internal/fleettest"
)

func TestMain(m *testing.M) {
	os.Exit(fleettest.Main(m))
}

func TestViolationCounters(t *testing.T) {
	text := `# HELP rollout_safety_violations_total Transfers that touched a released or reassigned block or slot.
# TYPE rollout_safety_violations_total counter
rollout_safety_violations_total 3
rollout_offload_resets_total 7
rollout_other_violations_total{kind="a"} 1 1700000000
rollout_other_violations_total{kind="b"} 2
`
	got, err := violationCounters(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"rollout_safety_violations_total": 3, "rollout_other_violations_total": 3}
	if len(got) != len(want) || got["rollout_safety_violations_total"] != 3 || got["rollout_other_violations_total"] != 3 {
		t.Fatalf("got %v, want %v", got, want)
	}
}
