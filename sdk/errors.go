package sdk

import (
	"errors"
	"fmt"
	"strings"
)

// Errors callers branch on (with errors.Is). Every error the client returns wraps one of them
// or a context error.
var (
	// ErrInvalid wraps every bad argument: the call was refused before touching the fleet.
	ErrInvalid = errors.New("sdk: invalid argument")
	// ErrNoServers means the fleet has no live server (or none of the requested targets).
	ErrNoServers = errors.New("sdk: no servers")
	// ErrStale means no server serves the requested MinVersion.
	ErrStale = errors.New("sdk: no server at the requested weight version")
	// ErrTimeout means a deadline passed: a server did not ack in time, or no server came
	// into rotation in time.
	ErrTimeout = errors.New("sdk: timeout")
	// ErrRejected means a server refused the request or command (bad signature, bad input,
	// expired): retrying the same thing will not help.
	ErrRejected = errors.New("sdk: rejected")
	// ErrFailed means a server acted on a command and it failed there.
	ErrFailed = errors.New("sdk: failed on server")
	// ErrPartial means a fleet call failed on at least one target; the *FleetError holds
	// the per-server results.
	ErrPartial = errors.New("sdk: failed on some servers")
	// ErrAborted means UpdateWeights stopped before its commit point: nobody swapped and the
	// fleet keeps serving the old version.
	ErrAborted = errors.New("sdk: update aborted before commit")
	// ErrConflict means the desired state changed under the call (another client updated
	// the fleet at the same time).
	ErrConflict = errors.New("sdk: desired state changed concurrently")
	// ErrBadSecret means the fleet's desired state or a heartbeat fails the signature check
	// with the client's secret (or the fleet is signed and the client has none).
	ErrBadSecret = errors.New("sdk: fleet secret does not match")
	// ErrDecode means a session's Decode (the caller's tokenizer) failed or panicked on a
	// turn's tokens; the turn is not kept and may be run again.
	ErrDecode = errors.New("sdk: session decode failed")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("sdk: client closed")
)

// FleetError is a fleet call that failed on some targets. Err is the fleet-level outcome
// (ErrPartial, or ErrAborted for an update stopped before its commit point); Results holds
// every target's result, the failed ones with their Err set. errors.Is sees Err and every
// server's error, so errors.Is(err, ErrTimeout) says whether some server timed out.
type FleetError struct {
	Op      string
	Err     error
	Results []ServerResult
}

// Error lists the failed servers.
func (e *FleetError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v:", e.Op, e.Err)
	n := 0
	for _, r := range e.Results {
		if r.Err == nil {
			continue
		}
		if n > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s: %v", r.ServerID, r.Err)
		n++
	}
	if n == 0 {
		b.WriteString(" no server failed")
	}
	return b.String()
}

// Unwrap returns the fleet-level error followed by every server's error.
func (e *FleetError) Unwrap() []error {
	errs := []error{e.Err}
	for _, r := range e.Results {
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return errs
}

// Failed returns the ids of the servers whose result has an error.
func (e *FleetError) Failed() []string {
	var ids []string
	for _, r := range e.Results {
		if r.Err != nil {
			ids = append(ids, r.ServerID)
		}
	}
	return ids
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
