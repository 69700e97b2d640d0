package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// Taking and growing leases.
//
// One lease serves allocations: the newest that does not retire. When it
// runs out, it is extended (LeaseRequest.extend_lease_id) rather than
// joined by another lease, so that the unused tail of an older lease is
// never stranded: the tail and the extension are runs of one local
// allocator, and one Release gives back what is left of both. A new lease
// is taken only when none serves: at the start, after a recall, a give-back
// or the loss of the lease, or when the server does not know extensions
// (it answers one with a new lease id; from then on every grant is a new
// lease, and up to MaxLeases serve at once).
//
// The serving lease grows ahead of need: once its free blocks drop below a
// low-water mark, a goroutine extends it in the background, so that an
// allocating goroutine seldom waits for a round trip. The mark starts at
// MinBlocks and doubles, up to four of the last grant, each time an
// allocation had to wait for a grant while a lease was serving: it follows
// the client's rate. A refused background grant pauses growing for a TTL
// (the allocating goroutine then asks itself, and falls back to per-call
// allocation).

// fragmentedBelow: a grant of fewer than this many requests' worth of
// blocks means the server's free space is fragmented.
const fragmentedBelow = 4

// growthWants: the low-water mark is at most this many of the last grant.
const growthWants = 4

// lease makes room for n more blocks: it extends the serving lease, or
// takes a new lease when none serves (the oldest leases past MaxLeases
// retire).
func (l *Leasing) lease(ctx context.Context, n uint64) error {
	l.mu.Lock()
	x := l.servingLocked()
	l.mu.Unlock()
	if x == nil || l.separate.Load() {
		sent := time.Now()
		r, err := l.ask(ctx, n, 0)
		if err != nil {
			return err
		}
		return l.adopt(r, n, sent)
	}
	err := l.extend(ctx, x.id, n)
	var ref *RefusedError
	if errors.As(err, &ref) && ref.LeaseGone() {
		// Expired or unknown after a restart: its uncommitted allocations
		// are lost, and a new lease serves.
		l.mu.Lock()
		l.dropLease(x.id, true)
		l.mu.Unlock()
		sent := time.Now()
		r, err := l.ask(ctx, n, 0)
		if err != nil {
			return err
		}
		return l.adopt(r, n, sent)
	}
	return err
}

// servingLocked is the lease that new allocations grow (l.mu held): the
// newest that does not retire, or nil.
func (l *Leasing) servingLocked() *localLease {
	for i := len(l.leases) - 1; i >= 0; i-- {
		if x := l.leases[i]; !x.retiring {
			return x
		}
	}
	return nil
}

// ask requests a grant of at least n blocks, added to lease extend when it
// is not 0. Near full a grant of MinBlocks may be refused while one of
// exactly n blocks is still possible: then that is asked for. A grant of a
// stale owner of the device (an older epoch than one seen) is an error
// (ErrFenced): its space is not used.
func (l *Leasing) ask(ctx context.Context, n, extend uint64) (*pb.LeaseResponse, error) {
	o := &l.opts
	req := &pb.LeaseRequest{
		Device:        l.c.device,
		ClientId:      o.ClientID,
		MinBlocks:     max(n, o.MinBlocks),
		WantBlocks:    o.WantBlocks,
		ExtendLeaseId: extend,
		Epoch:         l.c.epoch.Load(),
	}
	r, err := l.c.rpc.Lease(ctx, req)
	// Exactly n may fit where MinBlocks does not: on the device, or under
	// the tenant's quota.
	if err = statusError(ctx, err); err != nil && refusedForSpace(err) && n < o.MinBlocks {
		req.MinBlocks, req.WantBlocks = n, n
		r, err = l.c.rpc.Lease(ctx, req)
		err = statusError(ctx, err)
	}
	if err == nil {
		err = l.c.observe(r.Epoch)
	}
	return r, l.c.explain(ctx, err)
}

// grantedExtents are the extents of a grant, each checked to lie on the
// device.
func grantedExtents(r *pb.LeaseResponse) ([]Extent, error) {
	region := make([]Extent, 0, len(r.Extents))
	for _, pe := range r.Extents {
		e, err := fromPB(pe)
		if err != nil {
			return nil, err
		}
		if r.CapacityBlocks != 0 && e.End() > r.CapacityBlocks {
			return nil, badReply("lease %d: extent %s past the device's %d blocks", r.LeaseId, e, r.CapacityBlocks)
		}
		region = append(region, e)
	}
	return region, nil
}

func ttlOf(ms uint64) time.Duration {
	return time.Duration(max(ms, 1)) * time.Millisecond
}

// adopt makes a new lease granted to a request sent at sent serve; the
// oldest leases past MaxLeases retire. A grant whose deadline passed
// before it came is released at once (errLateGrant).
func (l *Leasing) adopt(r *pb.LeaseResponse, n uint64, sent time.Time) error {
	region, err := grantedExtents(r)
	if err != nil {
		return err
	}
	engine, err := newLocalAlloc(region)
	if err != nil {
		return fmt.Errorf("lease %d: %w", r.LeaseId, err)
	}
	ttl := ttlOf(r.TtlMs)
	l.noteGrant(engine.free, n, ttl)
	l.mu.Lock()
	active := 1
	for i := len(l.leases) - 1; i >= 0; i-- {
		if x := l.leases[i]; !x.retiring {
			active++
			if active > l.opts.MaxLeases {
				l.retireLocked(x)
			}
		}
	}
	x := &localLease{id: r.LeaseId, engine: engine}
	x.extended(sent, ttl, r.MarginMs)
	late := !time.Now().Before(x.deadline)
	x.retiring = late
	l.leases = append(l.leases, x)
	l.mu.Unlock()
	l.stats[statLeases].Add(1)
	// The background goroutine renews it (or releases it when late): it
	// sleeps for this lease's TTL from now on.
	l.notify()
	if late {
		return errLateGrant
	}
	return nil
}

// extend grows lease id by at least n blocks.
func (l *Leasing) extend(ctx context.Context, id, n uint64) error {
	sent := time.Now()
	r, err := l.ask(ctx, n, id)
	if err != nil {
		return err
	}
	if r.LeaseId != id {
		// A server without extensions ignored the field and granted a new
		// lease.
		l.separate.Store(true)
		return l.adopt(r, n, sent)
	}
	region, err := grantedExtents(r)
	if err != nil {
		return err
	}
	ttl := ttlOf(r.TtlMs)
	l.mu.Lock()
	x := l.find(id)
	if x == nil {
		// Dropped meanwhile as gone: the next request takes a new lease.
		l.mu.Unlock()
		return nil
	}
	if err := x.engine.addGrant(region); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("lease %d: %w", id, err)
	}
	// An extension moves the lease's deadline, as a renewal does; one that
	// came too late does not bring an expired lease back.
	x.extended(sent, ttl, r.MarginMs)
	if !time.Now().Before(x.deadline) {
		l.expireLocked(x)
		l.mu.Unlock()
		return errLateGrant
	}
	granted := sumExtents(region)
	l.mu.Unlock()
	l.stats[statExtensions].Add(1)
	l.noteGrant(granted, n, ttl)
	return nil
}

func sumExtents(es []Extent) uint64 {
	var s uint64
	for _, e := range es {
		s += e.Len
	}
	return s
}

// noteGrant records a grant of blocks for a request of n.
//
// The server halves a grant until a free run holds it, so a grant of a
// few objects, less than asked, means its long runs are gone. Leases would
// then take the last long runs and leave the short ones, which only
// per-call allocation (best fit on the server) fills, and the device would
// fail a request while a quarter of it is free in short runs. So for one
// lease time to live, requests no lease can serve go per call.
func (l *Leasing) noteGrant(blocks, n uint64, ttl time.Duration) {
	o := &l.opts
	l.lastGrant.Store(blocks)
	if blocks < fragmentedBelow*max(n, o.MinBlocks) && (o.WantBlocks == 0 || blocks < o.WantBlocks) {
		l.fragmented.Store(time.Now().Add(ttl).UnixNano())
	}
}

// waitedForGrant notes that an allocation waited for a grant although a
// lease was serving: the low-water mark doubles, up to growthWants grants.
func (l *Leasing) waitedForGrant() {
	lw := l.lowWater.Load()
	l.lowWater.Store(max(lw, min(2*lw, growthWants*max(l.lastGrant.Load(), l.opts.MinBlocks))))
}

// growSoon starts growing the serving lease x in the background when its
// free blocks are below the low-water mark (l.mu held); now is the time.
func (l *Leasing) growSoon(x *localLease, at time.Time) {
	now := at.UnixNano()
	if x.engine.free >= l.lowWater.Load() || l.separate.Load() || l.closing.Load() ||
		l.fragmented.Load() > now || l.growPaused.Load() > now ||
		!l.growing.CompareAndSwap(false, true) {
		return
	}
	go l.grow()
}

// grow extends the serving lease if it is still below the low-water mark.
func (l *Leasing) grow() {
	defer l.growing.Store(false)
	l.leasing.Lock()
	defer l.leasing.Unlock()
	l.mu.Lock()
	x := l.servingLocked()
	var id uint64
	var ttl time.Duration
	if x != nil && x.engine.free < l.lowWater.Load() && !l.closing.Load() {
		id, ttl = x.id, x.ttl
	}
	l.mu.Unlock()
	if id == 0 {
		return
	}
	ctx, cancel := l.rpcContext()
	defer cancel()
	if err := l.extend(ctx, id, l.opts.MinBlocks); err != nil {
		// Refused (no space, a recall, the lease gone) or not answered:
		// allocations go on from what is left, and one that finds no room
		// asks for itself.
		l.growPaused.Store(time.Now().Add(ttl).UnixNano())
	}
}
