package fleettest_test

import (
	"os"
	"testing"

	"github.com/rolloutkit/rollout/internal/fleettest"
)

func TestMain(m *testing.M) {
	os.Exit(fleettest.Main(m))
}
