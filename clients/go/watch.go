package blockalloc

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// watchRetry is how long the recall watcher waits before it opens a lost
// stream again: long enough not to hammer a server that is down, short
// next to a lease's TTL.
const watchRetry = time.Second

// watchRecalls follows the device's WatchRecalls stream until ctx ends
// (Close cancels it) and hands every lease back as soon as a recall starts,
// instead of at the next renewal (a third of a TTL away) or commit. A lost
// stream is opened again after watchRetry; against a server without the
// call, or one that refuses it for good (refusedForGood), it stops, and
// recalls reach this client through Renew and Commit replies only.
func (l *Leasing) watchRecalls(ctx context.Context) {
	defer close(l.watchDone)
	req := &pb.WatchRecallsRequest{Device: l.c.device}
	for {
		err := l.followRecalls(ctx, req)
		if ctx.Err() != nil || refusedForGood(err) {
			return
		}
		t := time.NewTimer(watchRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// refusedForGood tells a refusal that opening the stream again would only
// repeat: the call is missing, or this caller may not use it or the
// device. Renew and Commit replies still carry recalls then.
func refusedForGood(err error) bool {
	switch status.Code(err) {
	case codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated, codes.NotFound:
		return true
	}
	return false
}

// followRecalls opens one stream and acts on its events until it ends;
// it returns why it ended (a server-streaming call reports a refusal such
// as Unimplemented on its first receive, not when it is opened).
func (l *Leasing) followRecalls(ctx context.Context, req *pb.WatchRecallsRequest) error {
	stream, err := l.c.rpc.WatchRecalls(ctx, req)
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		if ev.Recall {
			l.recallAll()
		}
	}
}

// recallAll retires every lease the server recalls (all of this client's
// leases on the device) and wakes the background goroutine, which commits
// what they served and releases them. It takes l.mu only briefly, so
// allocations never wait for the stream.
func (l *Leasing) recallAll() {
	l.mu.Lock()
	retired := false
	for _, x := range l.leases {
		if !x.retiring {
			l.retireLocked(x)
			retired = true
		}
	}
	l.mu.Unlock()
	if retired {
		l.notify()
	}
}
