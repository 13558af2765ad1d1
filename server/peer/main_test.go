package peer

import (
	"testing"

	"go.uber.org/goleak"
)

// Relays wait on goroutines of their own: none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
