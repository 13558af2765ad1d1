package bus

import (
	"context"
	"errors"
	"time"
)

// Errors callers branch on.
var (
	// ErrNotFound is Get's answer for a key that does not exist (or expired).
	ErrNotFound = errors.New("bus: key not found")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("bus: closed")
	// ErrUnavailable wraps a transport failure (Redis down, dial refused, timeout); callers
	// may retry.
	ErrUnavailable = errors.New("bus: unavailable")
)

// EventKind says what a subscription event is.
type EventKind int

// Subscription events.
const (
	// EventMessage carries one published message.
	EventMessage EventKind = iota
	// EventSubscribed reports a re-established subscription after a disconnect: messages
	// may have been lost in between, so the subscriber resyncs from keys.
	EventSubscribed
)

// Event is one thing a subscription delivers.
type Event struct {
	Kind    EventKind
	Payload []byte // EventMessage only
}

// Subscription delivers the events of one channel until closed.
type Subscription interface {
	// Events delivers messages and resubscription notices, in order. It is closed after
	// Close (or when the bus is closed).
	Events() <-chan Event
	// Close ends the subscription; it is idempotent.
	Close() error
}

// Bus is the control plane's transport. Every method is safe for concurrent use and
// honours ctx.
type Bus interface {
	// Publish sends msg to the channel's current subscribers and returns how many there were.
	Publish(ctx context.Context, channel string, msg []byte) (int, error)
	// Subscribe subscribes to channel and returns once the subscription is confirmed, so a
	// message published after Subscribe returns is delivered (barring a later disconnect,
	// which is reported as EventSubscribed once the subscription is back).
	Subscribe(ctx context.Context, channel string) (Subscription, error)

	// Set stores val under key; ttl > 0 makes the key expire, ttl == 0 keeps it.
	Set(ctx context.Context, key string, val []byte, ttl time.Duration) error
	// Get returns key's value, or ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// Scan returns every key with the prefix and its value.
	Scan(ctx context.Context, prefix string) (map[string][]byte, error)
	// CompareAndSwap sets key to val only if its current value is old (old == nil: only if
	// the key does not exist), atomically, and reports whether it did.
	CompareAndSwap(ctx context.Context, key string, old, val []byte) (bool, error)
	// Delete removes keys; missing keys are not an error.
	Delete(ctx context.Context, keys ...string) error

	// Push appends val to the list and (re)sets the list's TTL to ttl (> 0).
	Push(ctx context.Context, list string, val []byte, ttl time.Duration) error
	// Pop removes and returns up to limit values from the head of the list, waiting up to
	// wait for at least one (wait <= 0: do not wait). No value before the wait ends is
	// (nil, nil), not an error.
	Pop(ctx context.Context, list string, limit int, wait time.Duration) ([][]byte, error)

	// Close releases the bus; subscriptions end and later calls return ErrClosed.
	Close() error
}
