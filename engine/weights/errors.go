package weights

import "errors"

// Sentinel errors callers branch on; returned errors wrap them with details.
var (
	// ErrBadCheckpoint means a checkpoint is malformed, truncated, or does not match its config.
	ErrBadCheckpoint = errors.New("weights: bad checkpoint")
	// ErrDigestMismatch means the SHA-256 of the fetched checkpoint differs from the Ref's.
	ErrDigestMismatch = errors.New("weights: digest mismatch")
	// ErrUnsupportedSource means a URI scheme, file kind or path that Load cannot use
	// (including a path outside Options.Root).
	ErrUnsupportedSource = errors.New("weights: unsupported source")
	// ErrInvalidRef means a Ref is malformed (empty URI, SHA-256 that is not 64 hex digits).
	ErrInvalidRef = errors.New("weights: invalid ref")
	// ErrUnsupportedFormat means the weights cannot be represented in the requested output
	// format (for example a rope_theta that llama2.c .bin files cannot carry).
	ErrUnsupportedFormat = errors.New("weights: unsupported format")
)
