package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinel errors; test for them with errors.Is. The errors this package
// returns wrap them with the server's explanation.
var (
	// ErrNoSpace: the device has no space of the requested shape; nothing
	// was allocated.
	ErrNoSpace = errors.New("no space")
	// ErrUnavailable: the server cannot be reached, is shutting down, its
	// device failed, or the caller's context ended first. Retrying later
	// (or elsewhere) may work.
	ErrUnavailable = errors.New("allocation service unavailable")
	// ErrLost: allocations made inside a lease were never committed and the
	// lease ended (it expired, or the server restarted); their blocks are
	// free again on the server and must not be used. The error is a
	// *LostError that lists them.
	ErrLost = errors.New("allocations lost before they were committed")
	// ErrClosed: the client or leasing allocator was closed.
	ErrClosed = errors.New("closed")
	// ErrBadReply: the server sent something this client cannot use.
	ErrBadReply = errors.New("bad reply from the server")
)

// LeaseGonePhrase is contained in every refusal of the server about a lease
// that ended or is unknown (see proto/blockalloc/v1/allocator.proto).
const LeaseGonePhrase = "take a new lease"

// RefusedError: the server refused a request (a bad request, a conflict
// with the device's state, an unknown device or lease). Nothing of the
// request was applied.
type RefusedError struct {
	// Code is the gRPC status code; the schema says what each one means.
	Code codes.Code
	// Reason is the server's explanation.
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused (%s): %s", e.Code, e.Reason)
}

// LeaseGone reports whether the refusal means that the lease no longer
// exists on the server: NOT_FOUND, or FAILED_PRECONDITION with
// LeaseGonePhrase.
func (e *RefusedError) LeaseGone() bool {
	return e.Code == codes.NotFound ||
		(e.Code == codes.FailedPrecondition && strings.Contains(e.Reason, LeaseGonePhrase))
}

// LostError lists allocations lost before they were committed; it matches
// ErrLost.
type LostError struct {
	// Extents are the lost allocations.
	Extents []Extent
}

func (e *LostError) Error() string {
	first := ""
	if len(e.Extents) > 0 {
		first = "; first: " + e.Extents[0].String()
	}
	return fmt.Sprintf("%d allocation(s) lost before they were committed (the lease ended: expired or server restart)%s",
		len(e.Extents), first)
}

// Is makes errors.Is(err, ErrLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// statusError maps an error of a gRPC call to this package's errors. ctx is
// the call's context: when it ended, the error also matches its reason
// (context.Canceled or context.DeadlineExceeded).
func statusError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, cerr)
		}
		return fmt.Errorf("%w: %s", ErrUnavailable, s.Message())
	case codes.ResourceExhausted:
		// The server's message usually starts with the same words.
		msg := strings.TrimPrefix(s.Message(), ErrNoSpace.Error()+": ")
		return fmt.Errorf("%w: %s", ErrNoSpace, msg)
	default:
		return &RefusedError{Code: s.Code(), Reason: s.Message()}
	}
}

func badReply(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadReply, fmt.Sprintf(format, args...))
}
