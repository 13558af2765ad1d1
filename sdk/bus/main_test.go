package bus_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every subscription, blocked Pop and Redis reader must be gone once its bus is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
