package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// Sentinel errors; test for them with errors.Is. The errors this package
// returns wrap them with the server's explanation.
var (
	// ErrNoSpace: the device has no space of the requested shape, or the
	// server's limits leave too little; nothing was allocated. The error
	// is a *NoSpaceError with the server's reason and, when the device had
	// no free run for the object, the device's state at the refusal.
	ErrNoSpace = errors.New("no space")
	// ErrQuota: the call would take the caller's tenant past its quota on
	// the device (the device itself may have room); nothing was applied.
	// The error is a *QuotaError that names the quota. Freeing the
	// tenant's space, releasing its leases or a larger quota makes room.
	ErrQuota = errors.New("over quota")
	// ErrUnavailable: the server cannot be reached, is shutting down, its
	// device failed, or the caller's context ended before the call was
	// sent; the call did not run. Sending it again later (or elsewhere) is
	// safe and may work.
	ErrUnavailable = errors.New("allocation service unavailable")
	// ErrOutcomeUnknown: the call was sent and cut off before its reply
	// (the connection broke, the stream ended without it, the server
	// answered CANCELLED or UNKNOWN, or the caller's context ended while it
	// waited): it may or may not have run. An Allocate may have allocated
	// blocks nobody knows of (reconcile finds them); a Free may have freed.
	// A Client sends such a call again with its request id (see
	// Options.RetryFor) when the server keeps ids (its replies carry an
	// epoch): then this error means that the retries ran out.
	// A leasing allocator's commit is resolved by itself: it sends the
	// batch again with the same sequence number, which the server applies
	// once.
	ErrOutcomeUnknown = errors.New("outcome unknown (the call was cut off after it was sent; it may have run)")
	// ErrLost: allocations made inside a lease were never committed and the
	// lease ended (the server says it expired or does not know it, or its
	// deadline passed before a commit got through); their blocks are free
	// again on the server, or soon will be, and must not be used. The error
	// is a *LostError that lists them.
	ErrLost = errors.New("allocations lost before they were committed")
	// ErrFenced: a stale owner of the device answered: a reply carried an
	// older epoch than one this client has seen for the device (its result
	// is not used), or the server refused a request that carried a newer
	// epoch than its own (UNAVAILABLE, "fenced"). It always comes with
	// ErrUnavailable: the device's current owner did not run the call, and
	// it is sent again as an unavailable one is.
	ErrFenced = errors.New("fenced (a stale owner of the device answered)")
	// ErrClosed: the client or leasing allocator was closed.
	ErrClosed = errors.New("closed")
	// ErrBadReply: the server sent something this client cannot use.
	ErrBadReply = errors.New("bad reply from the server")
)

// LeaseGonePhrase is contained in every refusal of the server about a lease
// that ended or is unknown (see crates/proto/proto/blockalloc/v1/allocator.proto).
const LeaseGonePhrase = "take a new lease"

// fencedPhrase is contained in a server's refusal of a request that
// carried a newer epoch than its own (see "Fencing" in the schema).
const fencedPhrase = "fenced"

// fencedReply is the error of a reply of epoch got from a device whose
// epoch this client has seen at seen (> got).
func fencedReply(got, seen uint64) error {
	return fmt.Errorf("%w: %w: a reply of epoch %d, older than the epoch %d seen before", ErrUnavailable, ErrFenced, got, seen)
}

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

// NoSpaceError: the server refused a call with RESOURCE_EXHAUSTED (no
// space of the requested shape, or too little left under the server's
// limits); nothing of the call was applied. A quota refusal is a
// *QuotaError instead. It matches ErrNoSpace,
// and its message is "no space: " and the reason.
//
// Get it with errors.As:
//
//	var ns *NoSpaceError
//	if errors.As(err, &ns) && ns.Details != nil {
//		// ns.Details.LargestFreeExtent < ns.Details.RequestedBlocks ...
//	}
type NoSpaceError struct {
	// Reason is the server's explanation, without a leading "no space: ".
	Reason string
	// Details is the device when it refused an allocation because no free
	// run could hold the object (NoSpaceDetails in the schema: the blocks
	// requested, free, in the longest free run, used, leased and unused,
	// and on the device), read in the same step as the refusal. Nil for
	// other refusals (limits, lease grants, a tenant's regions full), from
	// a server that does not send them, and for errors this client makes
	// up itself.
	Details *pb.NoSpaceDetails
}

// Error is "no space: " and the server's reason.
func (e *NoSpaceError) Error() string {
	return ErrNoSpace.Error() + ": " + e.Reason
}

// Unwrap returns ErrNoSpace, so that errors.Is(err, ErrNoSpace) holds.
func (e *NoSpaceError) Unwrap() error { return ErrNoSpace }

// noSpace is the error of a RESOURCE_EXHAUSTED refusal with message msg and
// details d (nil when the server sent none).
func noSpace(msg string, d *pb.NoSpaceDetails) *NoSpaceError {
	// The server's message usually starts with the same words.
	return &NoSpaceError{Reason: strings.TrimPrefix(msg, ErrNoSpace.Error()+": "), Details: d}
}

// QuotaError: the server refused a call because it would take the
// caller's tenant past its quota on the device (RESOURCE_EXHAUSTED with a
// QuotaDetails); nothing of the call was applied. It matches ErrQuota, not
// ErrNoSpace, and its message is "over quota: " and the server's reason
// (which names tenant, device and bytes).
//
//	var q *QuotaError
//	if errors.As(err, &q) {
//		// q.Details.Tenant, q.Details.QuotaBytes ...
//	}
type QuotaError struct {
	// Reason is the server's explanation.
	Reason string
	// Details name the quota (tenant, device, quota_bytes) and how far the
	// call would have gone past it (held_bytes, asked_bytes).
	Details *pb.QuotaDetails
}

// Error is "over quota: " and the server's reason.
func (e *QuotaError) Error() string {
	return ErrQuota.Error() + ": " + e.Reason
}

// Unwrap returns ErrQuota, so that errors.Is(err, ErrQuota) holds.
func (e *QuotaError) Unwrap() error { return ErrQuota }

// exhausted is the error of a RESOURCE_EXHAUSTED refusal with message msg:
// a *QuotaError when q marks it as a quota's, else a *NoSpaceError with d.
func exhausted(msg string, q *pb.QuotaDetails, d *pb.NoSpaceDetails) error {
	if q != nil {
		return &QuotaError{Reason: msg, Details: q}
	}
	return noSpace(msg, d)
}

// refusedForSpace reports whether err refuses a call for want of room: on
// the device (ErrNoSpace) or under the tenant's quota (ErrQuota).
func refusedForSpace(err error) bool {
	return errors.Is(err, ErrNoSpace) || errors.Is(err, ErrQuota)
}

// quotaDetails is the QuotaDetails among the details of s, or nil.
func quotaDetails(s *status.Status) *pb.QuotaDetails {
	for _, d := range s.Details() {
		if q, ok := d.(*pb.QuotaDetails); ok {
			return q
		}
	}
	return nil
}

// noSpaceDetails is the NoSpaceDetails among the details of s, or nil.
// Details that do not decode are ignored: the code and message still say
// what happened.
func noSpaceDetails(s *status.Status) *pb.NoSpaceDetails {
	for _, d := range s.Details() {
		if ns, ok := d.(*pb.NoSpaceDetails); ok {
			return ns
		}
	}
	return nil
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
	return fmt.Sprintf("%d allocation(s) lost before they were committed (the lease ended, or its deadline passed)%s",
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
	case codes.Unavailable:
		// The server's own refusal, or no connection: nothing ran.
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, cerr)
		}
		if strings.Contains(s.Message(), fencedPhrase) {
			return fmt.Errorf("%w: %w: %s", ErrUnavailable, ErrFenced, s.Message())
		}
		return fmt.Errorf("%w: %s", ErrUnavailable, s.Message())
	case codes.DeadlineExceeded, codes.Canceled, codes.Unknown:
		// Cut off after it was sent (a broken connection, the server's
		// request timeout, the caller's context): it may have run.
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%w: %w", ErrOutcomeUnknown, cerr)
		}
		return fmt.Errorf("%w: %s", ErrOutcomeUnknown, s.Message())
	case codes.ResourceExhausted:
		return exhausted(s.Message(), quotaDetails(s), noSpaceDetails(s))
	default:
		return &RefusedError{Code: s.Code(), Reason: s.Message()}
	}
}

// callError maps the error reply of a call on the Calls stream to this
// package's errors, as statusError maps the status of the same call made
// unary: CallError.no_space and CallError.quota are what the unary call's
// status details carry.
func callError(ctx context.Context, id uint64, e *pb.CallError) error {
	switch code := codes.Code(e.GetCode()); code {
	case codes.OK:
		return badReply("call %d: an error reply with code OK: %s", id, e.GetMessage())
	case codes.ResourceExhausted:
		return exhausted(e.GetMessage(), e.GetQuota(), e.GetNoSpace())
	default:
		return statusError(ctx, status.Error(code, e.GetMessage()))
	}
}

func badReply(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadReply, fmt.Sprintf(format, args...))
}
