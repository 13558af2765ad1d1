package weights

import (
	"testing"

	"go.uber.org/goleak"
)

// readSTData hashes on its own goroutine: no load may leave it running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
