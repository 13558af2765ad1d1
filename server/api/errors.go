package api

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/rolloutkit/rollout/engine"
	"github.com/rolloutkit/rollout/engine/model"
	"github.com/rolloutkit/rollout/engine/sample"
	"github.com/rolloutkit/rollout/engine/weights"
)

// Error types of the JSON error body, as OpenAI names them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeNotFound       = "not_found_error"
	typeConflict       = "conflict_error"
	typeRateLimit      = "rate_limit_error"
	typeUnavailable    = "service_unavailable_error"
	typeInternal       = "internal_error"
)

// Error is an API error: the HTTP status and the body's type, code and message. Handlers return
// it (or any error, which [classify] maps) and one place renders it.
type Error struct {
	Status  int
	Type    string
	Code    string
	Message string
	// Param names the offending request field, when one is known.
	Param string
}

// Error implements error.
func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

func badRequest(code, param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// errorBody is the JSON error shape of docs/http-api.md.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Code    any     `json:"code"`
	Param   *string `json:"param"`
}

// classify maps any error to an *Error: the engine's and the loaders' sentinels to the status
// docs/http-api.md documents, anything unknown to a 500 (a bug, never bad input).
func classify(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	var fe *sample.FieldError
	switch {
	case errors.As(err, &fe):
		return badRequest("invalid_value", fe.Field, "%s", err.Error())
	case errors.Is(err, engine.ErrInvalidRequest), errors.Is(err, engine.ErrInvalidArgument):
		return badRequest("invalid_value", "", "%s", err.Error())
	case errors.Is(err, engine.ErrQueueFull):
		return &Error{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "queue_full", Message: err.Error()}
	case errors.Is(err, engine.ErrDuplicateID):
		return &Error{Status: http.StatusConflict, Type: typeConflict, Code: "duplicate_request_id", Message: err.Error()}
	case errors.Is(err, engine.ErrAsleep), errors.Is(err, engine.ErrNoWeights),
		errors.Is(err, engine.ErrNothingStaged), errors.Is(err, engine.ErrNotStaged), errors.Is(err, engine.ErrStaleVersion):
		return &Error{Status: http.StatusConflict, Type: typeConflict, Code: "conflict", Message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client went away or gave up; nobody may read this, but it is no server error.
		return &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "cancelled", Message: err.Error()}
	case errors.Is(err, engine.ErrClosed), errors.Is(err, errShuttingDown):
		return &Error{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "unavailable", Message: err.Error()}
	case errors.Is(err, weights.ErrDigestMismatch):
		return &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "digest_mismatch", Param: "sha256", Message: err.Error()}
	case errors.Is(err, weights.ErrInvalidRef), errors.Is(err, weights.ErrUnsupportedSource):
		return badRequest("invalid_source", "source", "%s", err.Error())
	case errors.Is(err, weights.ErrTooSlow):
		return &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "source_too_slow", Param: "source", Message: err.Error()}
	case errors.Is(err, weights.ErrAddressRefused):
		return &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "source_refused", Param: "source", Message: err.Error()}
	case errors.Is(err, weights.ErrFetch) && errors.Is(err, fs.ErrNotExist):
		return &Error{Status: http.StatusNotFound, Type: typeNotFound, Code: "source_not_found", Param: "source", Message: err.Error()}
	case errors.Is(err, model.ErrShape):
		return &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "shape_mismatch", Param: "source", Message: err.Error()}
	case errors.Is(err, weights.ErrFetch), errors.Is(err, weights.ErrBadCheckpoint), errors.Is(err, weights.ErrUnsupportedFormat):
		return &Error{Status: http.StatusUnprocessableEntity, Type: typeInvalidRequest, Code: "bad_checkpoint", Param: "source", Message: err.Error()}
	}
	// An unknown error is a bug: its text may name internals, so the client gets a generic
	// message and the log (writeError) the detail.
	return &Error{Status: http.StatusInternalServerError, Type: typeInternal, Code: "internal", Message: "internal error"}
}

// writeError renders err as the JSON error body and aborts the gin chain. A request refused
// before its body was read (authentication, routing, admission) has it left unread and its
// connection closed after the answer: net/http would otherwise read up to 256 KiB of it
// first, for as long as the client takes to send it, so a refusal costs the same whatever
// the client declared.
func writeError(c *gin.Context, err error) {
	if _, read := c.Get(ctxBody); !read && hasBody(c.Request) {
		c.Header("Connection", "close")
		_ = http.NewResponseController(c.Writer).SetReadDeadline(time.Now())
	}
	e := classify(err)
	if e.Status == http.StatusInternalServerError {
		if a, ok := c.Get(ctxAPI); ok {
			a.(*API).log.Error("api: internal error", "path", c.Request.URL.Path, "err", err)
		}
	}
	d := errorDetail{Message: e.Message, Type: e.Type, Code: e.Code}
	if e.Code == "" {
		d.Code = nil
	}
	if e.Param != "" {
		p := e.Param
		d.Param = &p
	}
	c.AbortWithStatusJSON(e.Status, errorBody{Error: d})
}
