package trainer

import "errors"

// Sentinel errors callers branch on; returned errors wrap them with details.
var (
	// ErrInvalidConfig means a Config the trainer cannot use (a negative learning rate, a clip
	// range outside (0,1), ...).
	ErrInvalidConfig = errors.New("trainer: invalid config")
	// ErrInvalidSample means a Sample that cannot be trained on: an empty prompt or completion,
	// per-token slices of the wrong length, a token outside the vocabulary, a sequence longer
	// than the context, a non-finite reward or logprob, or a weight version newer than the
	// trainer's.
	ErrInvalidSample = errors.New("trainer: invalid sample")
	// ErrGroupTooSmall means a group of fewer than two samples: a group-normalised advantage
	// needs at least two rewards to compare.
	ErrGroupTooSmall = errors.New("trainer: group has fewer than 2 samples")
	// ErrEmptyBatch means Step was called without samples.
	ErrEmptyBatch = errors.New("trainer: empty batch")
	// ErrShapeMismatch means weights, a checkpoint or optimizer state of another model shape.
	ErrShapeMismatch = errors.New("trainer: model shape mismatch")
	// ErrBadCheckpoint means a trainer checkpoint directory that is missing files or malformed.
	ErrBadCheckpoint = errors.New("trainer: bad checkpoint")
	// ErrClosed means the Trainer was used after Close.
	ErrClosed = errors.New("trainer: closed")
)
