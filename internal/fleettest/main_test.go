package fleettest_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/rolloutkit/rollout/internal/fleettest"
)

func TestMain(m *testing.M) {
	code := fleettest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
