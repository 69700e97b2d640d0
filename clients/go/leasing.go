package blockalloc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/blockalloc/blockalloc/clients/go/blockallocv1"
)

// Leasing allocates inside regions leased from the server, at local speed.
//
// It leases a region of the device and serves allocations from it with a
// local allocator built over the leased extents, with no round trip.
// Allocations are recorded as pending; a background goroutine sends them,
// with pending frees, in one Commit per lease (so allocations of many
// goroutines share one RPC), keeps leases alive with Renew, gives back
// leases the server recalls, and releases leases that are retired. A
// second goroutine follows the device's WatchRecalls stream, so that a
// recall retires every lease at once rather than at the next Renew or
// Commit reply (see watch.go).
//
// A batch is sent when a caller's Commit asks for it, when CommitInterval
// has passed since its oldest allocation or free, when the server recalls a
// lease, and on Close or when the leases are given back; other wake-ups of
// the background goroutine (renewals, a new lease) send nothing, so that
// allocations keep gathering into one RPC.
//
// Life of an allocation:
//   - Allocate: pending (its blocks are the caller's, but an expired lease
//     frees them again on the server); the caller may write into it until
//     its lease's deadline (Deadline; see "The writer's rule" in the
//     package docs);
//   - the next commit: durable; Commit waits for it;
//   - a lease that ends before its allocations were committed (the server
//     answers NOT_FOUND or FAILED_PRECONDITION "take a new lease") makes
//     them lost, and so does the lease's deadline passing while its commit
//     cannot reach the server: the next Commit reports them in a
//     *LostError (errors.Is(err, ErrLost)), each once, and later
//     allocations take a new lease. A commit that fails as unavailable or
//     cut off (a server restarting keeps its leases) is sent again with
//     its sequence number until then, and loses nothing.
//
// Each lease's deadline is when the request that last kept it alive
// (grant, extension, renewal, commit) was sent, plus its TTL, minus the
// server's margin, on the monotonic clock. From then on the lease serves
// no allocation and retires: what it served is committed (the server keeps
// the lease a margin longer), and it is released.
//
// One lease serves allocations; when it runs low it is extended, ahead of
// need in the background (see grant.go), and the blocks that its commits
// free are recycled into it (CommitRequest.recycle_frees): freed space is
// reused locally, as an in-process allocator reuses it, instead of leaving
// holes that only per-call allocation fills. When the server grants no
// lease (the device is nearly full), or only small ones (its
// free space is in short runs, which per-call best fit on the server packs
// better than leases), Allocate falls back to a per-call Allocate, durable
// at once; before it reports ErrNoSpace it gives its own leases back and
// tries once more, so that ErrNoSpace means no space. The error it reports
// then is the server's refusal of that last per-call Allocate: a
// *NoSpaceError with the device's state at the refusal. Losses and refused
// batches that the give-back's commit finds concern earlier allocations and
// frees, not this one: they are left for the next Commit to report, as any
// others.
//
// Each lease has its own local allocator: extents of two leases may touch,
// and one allocator would merge them into a run no single lease contains.
//
// A Leasing is safe for many goroutines.
type Leasing struct {
	c    *Client
	opts LeaseOptions

	mu      sync.Mutex
	leases  []*localLease // oldest first
	pending map[Extent]uint64
	frees   []Extent
	openGen uint64 // generation of the batch being gathered
	doneGen uint64 // newest generation the background goroutine finished
	genDone chan struct{}
	// The newest generation a caller's Commit waits for: the batch is due
	// while wanted >= openGen.
	wanted uint64
	// When the oldest allocation, free or unacknowledged commit still to be
	// sent was made; zero when there is none. The batch is due
	// CommitInterval after it.
	since time.Time
	// A retired (or recalled) lease waits for its commit before it can be
	// released: the batch is due now.
	urgent bool
	lost   []Extent
	// The newest generation whose commit failed as unavailable, and why;
	// another error of a commit, not yet reported.
	unavailGen uint64
	unavailErr error
	refusedErr error
	paused     *pause // set by tests to stop the background goroutine

	leasing sync.Mutex // serialises lease requests
	// Every grant is a new lease (LeaseOptions.SeparateLeases, or a server
	// without extensions); else one lease serves and is extended.
	separate atomic.Bool
	// A serving lease with fewer free blocks grows in the background.
	lowWater  atomic.Uint64
	lastGrant atomic.Uint64 // blocks of the last grant
	growing   atomic.Bool   // a background extension runs
	// Until this time (Unix ns), no background extension (one was refused).
	growPaused atomic.Int64
	// Until this time (Unix ns), requests that no lease can serve go per
	// call instead of taking a new lease (see lease).
	fragmented atomic.Int64
	wake       chan struct{}
	closing    atomic.Bool
	closed     chan struct{}
	// Stops the recall watcher; watchDone is closed when it has stopped.
	stopWatch context.CancelFunc
	watchDone chan struct{}
	bgErr     error
	stats     [statCount]atomic.Uint64
}

// LeaseOptions say how a Leasing leases and commits.
type LeaseOptions struct {
	// MinBlocks is the smallest useful lease, in blocks (at least the
	// largest object); 0 means 1024.
	MinBlocks uint64
	// WantBlocks is the lease size to ask for; 0 lets the server size
	// leases from this client's rate.
	WantBlocks uint64
	// CommitInterval is how long pending allocations wait for the
	// background commit when nobody calls Commit; 0 means 5 ms.
	CommitInterval time.Duration
	// ClientID is this client's id for the server's lease sizing; empty
	// means "pid-<process id>".
	ClientID string
	// SeparateLeases takes a new lease whenever the serving leases have
	// no run long enough, instead of extending the one serving lease, and
	// recycles no frees: how a Leasing works against a server without
	// lease extension (it notices one by itself).
	SeparateLeases bool
	// MaxLeases is, with separate leases, how many serve allocations at
	// once; 0 means 4. A new lease is taken when no lease has a run long
	// enough; the older ones keep serving requests that fit their leftover
	// runs, so that the tails of leases get used instead of coming back to
	// the server as fragments. Past MaxLeases, the oldest retires.
	MaxLeases int
}

// LeaseStats are counters of a Leasing.
type LeaseStats struct {
	// LocalAllocations were served from a lease, locally.
	LocalAllocations uint64
	// RemoteAllocations fell back to a per-call Allocate.
	RemoteAllocations uint64
	// Leases were granted (new leases; see Extensions).
	Leases uint64
	// CommitCalls were sent (resends included).
	CommitCalls uint64
	// Lost allocations were reported.
	Lost uint64
	// Extensions grew a held lease.
	Extensions uint64
	// RecycledBlocks came back into a lease from the frees of its commits.
	RecycledBlocks uint64
}

const (
	statLocal = iota
	statRemote
	statLeases
	statCommits
	statLost
	statExtensions
	statRecycled
	statCount
)

type localLease struct {
	id       uint64
	engine   *localAlloc
	lastSeq  uint64
	inflight *inflight
	retiring bool // no new allocations; released once all is committed
	ttl      time.Duration
	// renewed is when the request that last kept the lease alive was sent;
	// the next renewal is due a third of a TTL later.
	renewed time.Time
	// deadline is the writer's deadline (see "The writer's rule" in the
	// schema): until then uncommitted allocations may be written; from
	// then on the lease serves nothing, and a commit that still fails to
	// reach the server is given up (its allocations are lost). Read with
	// the monotonic clock.
	deadline time.Time
}

// extended notes a reply that kept the lease alive: to the request sent at
// sent, with ttl and the reply's margin_ms. The deadline only moves on:
// each reply proves the lease lives until at least its own deadline.
func (x *localLease) extended(sent time.Time, ttl time.Duration, marginMs uint64) {
	x.ttl = ttl
	if sent.After(x.renewed) {
		x.renewed = sent
	}
	if d := leaseDeadline(sent, ttl, marginMs); d.After(x.deadline) {
		x.deadline = d
	}
}

// leaseDeadline is the writer's deadline of a lease kept alive by a request
// sent at sent, whose reply gave ttl and marginMs: sent + ttl - margin,
// where a margin of 0 (a server that sends none) is taken as ttl/20.
func leaseDeadline(sent time.Time, ttl time.Duration, marginMs uint64) time.Time {
	margin := time.Duration(marginMs) * time.Millisecond
	if margin == 0 {
		margin = ttl / 20
	}
	return sent.Add(ttl - margin)
}

// inflight is a commit sent but not acknowledged: resent as is (same
// sequence, same contents) until the server answers, which makes it
// idempotent.
type inflight struct {
	seq     uint64
	allocs  []Extent
	frees   []Extent
	recycle bool // CommitRequest.recycle_frees
	// sent is when it was first sent: a resend may be answered with the
	// first sending's reply, which renewed the lease no earlier than that.
	sent time.Time
	// maybeRan: a sending was cut off with its outcome unknown.
	maybeRan bool
}

// NewLeasing makes a leasing allocator over c and starts its background
// goroutine and its recall watcher; Close stops both. It takes no lease
// until the first Allocate.
func (c *Client) NewLeasing(opts LeaseOptions) *Leasing {
	if opts.MinBlocks == 0 {
		opts.MinBlocks = 1024
	}
	if opts.CommitInterval <= 0 {
		opts.CommitInterval = 5 * time.Millisecond
	}
	if opts.MaxLeases <= 0 {
		opts.MaxLeases = 4
	}
	if opts.ClientID == "" {
		opts.ClientID = fmt.Sprintf("pid-%d", os.Getpid())
	}
	l := &Leasing{
		c:         c,
		opts:      opts,
		pending:   make(map[Extent]uint64),
		openGen:   1,
		genDone:   make(chan struct{}),
		wake:      make(chan struct{}, 1),
		closed:    make(chan struct{}),
		watchDone: make(chan struct{}),
	}
	l.separate.Store(opts.SeparateLeases)
	l.lowWater.Store(opts.MinBlocks)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	l.stopWatch = stopWatch
	go l.background()
	go l.watchRecalls(watchCtx)
	return l
}

// Stats are the counters so far.
func (l *Leasing) Stats() LeaseStats {
	g := func(i int) uint64 { return l.stats[i].Load() }
	return LeaseStats{
		LocalAllocations:  g(statLocal),
		RemoteAllocations: g(statRemote),
		Leases:            g(statLeases),
		CommitCalls:       g(statCommits),
		Lost:              g(statLost),
		Extensions:        g(statExtensions),
		RecycledBlocks:    g(statRecycled),
	}
}

// LeaseIDs are the ids of the leases held now, oldest first.
func (l *Leasing) LeaseIDs() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]uint64, len(l.leases))
	for i, x := range l.leases {
		ids[i] = x.id
	}
	return ids
}

func (l *Leasing) notify() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// TryAllocateLocal allocates n contiguous blocks from a lease without a
// round trip, or reports false when no lease has room (it never waits).
// Deadline says until when the caller may write into it uncommitted.
func (l *Leasing) TryAllocateLocal(n uint64) (Extent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.allocLocked(n)
}

// allocLocked serves n blocks from the oldest lease that has a run for
// them, so that the tails of older leases are used up first. A lease past
// its deadline serves nothing and retires.
func (l *Leasing) allocLocked(n uint64) (Extent, bool) {
	now := time.Now()
	for _, x := range l.leases {
		if x.retiring {
			continue
		}
		if !now.Before(x.deadline) {
			l.expireLocked(x)
			continue
		}
		if e, ok := x.engine.alloc(n); ok {
			l.pending[e] = x.id
			l.gatheredLocked()
			l.stats[statLocal].Add(1)
			l.growSoon(x, now)
			return e, true
		}
	}
	return Extent{}, false
}

// expireLocked retires lease x, past its deadline (l.mu held), and wakes
// the background goroutine to commit what it served.
func (l *Leasing) expireLocked(x *localLease) {
	l.retireLocked(x)
	l.notify()
}

// Deadline is the writer's deadline of allocation e (an extent as Allocate
// returned it) while it is not committed: until then the caller may write
// into it; from then on it must not, unless a Commit that returned without
// error since made it durable (a Commit that reports e lost means it is
// free on the server). ok is false when e is not an uncommitted allocation
// of a lease: committed (or allocated per call: durable at once), lost,
// or not allocated here.
//
// The deadline is when the request that last kept e's lease alive was
// sent, plus the lease's TTL, minus the server's margin (see "The writer's
// rule" in the schema); renewals and commits move it on. It carries the
// monotonic clock: compare it with time.Now(), never with a wall time.
func (l *Leasing) Deadline(e Extent) (deadline time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := l.pending[e]
	if !ok {
		for _, x := range l.leases {
			if x.inflight != nil && slices.Contains(x.inflight.allocs, e) {
				id, ok = x.id, true
				break
			}
		}
	}
	if !ok {
		return time.Time{}, false
	}
	if x := l.find(id); x != nil {
		return x.deadline, true
	}
	return time.Time{}, false
}

// gatheredLocked notes that the batch has something to send (l.mu held):
// the first item starts the CommitInterval clock, and wakes the background
// goroutine so that it waits for that deadline.
func (l *Leasing) gatheredLocked() {
	if l.since.IsZero() {
		l.since = time.Now()
		l.notify()
	}
}

// Allocate allocates n contiguous blocks: locally from a lease when one has
// room, else after extending the serving lease (or leasing a new region
// when none serves), else (when the server grants nothing) by a per-call
// allocation, durable at once. A leased allocation is durable after the
// next Commit; until then the caller writes into it only before its
// Deadline.
//
// Errors: ErrNoSpace (the *NoSpaceError of the last per-call refusal, with
// its Details), ErrQuota (the *QuotaError of a per-call refusal for the
// tenant's quota), ErrUnavailable, ErrClosed, *RefusedError.
func (l *Leasing) Allocate(ctx context.Context, n uint64) (Extent, error) {
	if n == 0 {
		return Extent{}, invalid("cannot allocate zero blocks")
	}
	for {
		if l.closing.Load() {
			return Extent{}, ErrClosed
		}
		if e, ok := l.TryAllocateLocal(n); ok {
			return e, nil
		}
		// This allocation waits for a grant (a background one in flight, or
		// its own) although a lease serves: grow sooner.
		l.mu.Lock()
		serving := l.servingLocked() != nil
		l.mu.Unlock()
		if serving {
			l.waitedForGrant()
		}
		l.leasing.Lock()
		if e, ok := l.TryAllocateLocal(n); ok {
			l.leasing.Unlock()
			return e, nil
		}
		var err error
		if l.fragmented.Load() > time.Now().UnixNano() {
			err = errFragmented
		} else {
			err = l.lease(ctx, n)
		}
		l.leasing.Unlock()
		switch {
		case err == nil:
			continue
		case refusedForSpace(err) || err == errFragmented || err == errLateGrant:
			return l.allocateRemote(ctx, n)
		default:
			return Extent{}, err
		}
	}
}

// errFragmented: the server's free space is too fragmented for a lease
// worth taking; allocate per call.
var errFragmented = errors.New("free space too fragmented to lease")

// errLateGrant: a grant's reply came after the deadline it gave (the round
// trip took longer than the TTL less the margin); allocate per call.
var errLateGrant = errors.New("the lease grant came after its deadline")

// allocateRemote allocates n blocks per call, durable at once; when the
// server has no space (or the tenant's quota no room) and this client holds
// leases, it gives them back and tries once more. A refusal is returned as
// the server sent it (a *NoSpaceError or *QuotaError with its details); what the give-back finds about earlier
// allocations (lost ones, a refused batch) is left for the next Commit.
func (l *Leasing) allocateRemote(ctx context.Context, n uint64) (Extent, error) {
	e, err := l.c.Allocate(ctx, n)
	if refusedForSpace(err) && len(l.LeaseIDs()) > 0 {
		// Our own leases may hold the space (they count against the
		// tenant's quota too).
		if err := l.giveBack(ctx); err != nil {
			return Extent{}, err
		}
		e, err = l.c.Allocate(ctx, n)
	}
	if err != nil {
		return Extent{}, err
	}
	l.stats[statRemote].Add(1)
	return e, nil
}

// giveBack commits everything and releases every lease held now; it waits
// (at most a second) for the releases. It fails only when the commit could
// not be sent (ErrUnavailable). Lost allocations and refused batches that
// the commit reports stay where Commit finds them, untaken: they are
// reports about earlier allocations and frees, for the next Commit (each
// once, as always), not the answer of the allocation that gives back.
func (l *Leasing) giveBack(ctx context.Context) error {
	l.mu.Lock()
	ids := make(map[uint64]bool, len(l.leases))
	for _, x := range l.leases {
		x.retiring = true
		ids[x.id] = true
	}
	l.mu.Unlock()
	my, err := l.flush(ctx)
	if err == nil && my != 0 {
		l.mu.Lock()
		if l.unavailErr != nil && l.unavailGen >= my {
			err = l.unavailErr
		}
		l.mu.Unlock()
	}
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		held := false
		for _, id := range l.LeaseIDs() {
			held = held || ids[id]
		}
		if !held {
			break
		}
		l.notify()
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// Free frees e: an uncommitted allocation goes straight back to its lease;
// a committed one (leased or per call) is freed with the next commit,
// durable when a later Commit returns.
//
// Errors: ErrClosed.
func (l *Leasing) Free(e Extent) error {
	if l.closing.Load() {
		return ErrClosed
	}
	if e.Len == 0 {
		return invalid("cannot free an empty extent at %d", e.Start)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if id, ok := l.pending[e]; ok {
		delete(l.pending, e)
		for _, x := range l.leases {
			if x.id == id {
				x.engine.release(e)
				break
			}
		}
		return nil
	}
	l.frees = append(l.frees, e)
	l.gatheredLocked()
	return nil
}

// Commit waits until every allocation and free made before the call is
// durable.
//
// Errors: a *LostError (ErrLost) with the allocations, of this caller or
// any other, lost since the last report; each loss is reported once.
// ErrUnavailable when the server could not be reached (ErrFenced among
// them: a stale owner answered), ErrOutcomeUnknown when the commit was cut
// off after it was sent: either way the batch stays pending and is resent
// with its sequence number, which the server applies once, so call Commit
// again; once the lease's deadline has passed its allocations are reported
// lost instead. Other refusals as the
// server sent them. ctx ending stops the wait, not the commit.
func (l *Leasing) Commit(ctx context.Context) error {
	my, err := l.flush(ctx)
	if my == 0 || err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	if len(l.lost) > 0 {
		errs = append(errs, &LostError{Extents: l.lost})
		l.lost = nil
	}
	// A refusal is reported once, to the first Commit that sees it, even
	// when it hit a background commit nobody waited for.
	if l.refusedErr != nil {
		errs = append(errs, l.refusedErr)
		l.refusedErr = nil
	}
	if l.unavailErr != nil && l.unavailGen >= my {
		errs = append(errs, l.unavailErr)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// flush has everything made before the call committed, as Commit does, and
// returns the generation of the commit round it waited for; it reports
// nothing of what that round found (Commit does). It returns 0 when there
// is nothing to send or report, and ErrUnavailable when ctx ends first.
func (l *Leasing) flush(ctx context.Context) (uint64, error) {
	l.mu.Lock()
	if len(l.pending) == 0 && len(l.frees) == 0 && len(l.lost) == 0 && !l.anyInflight() &&
		l.refusedErr == nil {
		l.mu.Unlock()
		return 0, nil
	}
	my := l.openGen
	l.wanted = max(l.wanted, my)
	l.mu.Unlock()
	l.notify()
	for {
		l.mu.Lock()
		done, ch := l.doneGen, l.genDone
		l.mu.Unlock()
		if done >= my {
			return my, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return my, fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		}
	}
}

func (l *Leasing) anyInflight() bool {
	for _, x := range l.leases {
		if x.inflight != nil {
			return true
		}
	}
	return false
}

// Close commits everything, releases every lease (its unused rest becomes
// free on the server) and stops the background goroutine. It does not close
// the Client. Errors as Commit's, or ErrUnavailable when leases could not
// be released (they then expire on the server).
func (l *Leasing) Close(ctx context.Context) error {
	if l.closing.Load() {
		<-l.closed
		return ErrClosed
	}
	err := l.Commit(ctx)
	l.closing.Store(true)
	// Closing releases every lease anyway; the watcher's stream ends with
	// its context, so it stops at once.
	l.stopWatch()
	<-l.watchDone
	l.notify()
	select {
	case <-l.closed:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
	}
	return errors.Join(err, l.bgErr)
}

// background commits, renews and releases until Close; then commits and
// releases everything.
func (l *Leasing) background() {
	defer close(l.closed)
	closingRounds := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		l.mu.Lock()
		p := l.paused
		l.mu.Unlock()
		if p != nil {
			close(p.acked)
			<-p.resume
			l.mu.Lock()
			l.paused = nil
			l.mu.Unlock()
		}
		if due, wait := l.nextRound(time.Now()); !due {
			timer.Reset(wait)
			select {
			case <-l.wake:
			case <-timer.C:
			}
		}
		closing := l.closing.Load()
		l.expireRound(time.Now())
		if due, _ := l.nextRound(time.Now()); due {
			l.commitRound()
		}
		l.renewRound()
		l.releaseRound(closing)
		if closing {
			closingRounds++
			l.mu.Lock()
			released := len(l.leases) == 0
			l.mu.Unlock()
			if released || closingRounds >= 5 {
				if !released {
					l.bgErr = fmt.Errorf("%w: leases could not be released; they expire on the server", ErrUnavailable)
				}
				l.finishGen(^uint64(0))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// expireRound retires the leases past their deadline: they serve nothing
// more, and what they served is committed now.
func (l *Leasing) expireRound(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.leases {
		if !x.retiring && !now.Before(x.deadline) {
			l.retireLocked(x)
		}
	}
}

// idleWait is how long the background goroutine sleeps when nothing is
// due: it holds no lease and has nothing to commit, and a wake-up ends the
// sleep as soon as either changes.
const idleWait = time.Hour

// nextRound says whether the batch is due now, and else how long the
// background goroutine may sleep before a commit or a renewal is due.
func (l *Leasing) nextRound(now time.Time) (commitDue bool, wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing.Load() || l.urgent || l.wanted >= l.openGen {
		return true, 0
	}
	wait = idleWait
	if !l.since.IsZero() {
		wait = l.since.Add(l.opts.CommitInterval).Sub(now)
		if wait <= 0 {
			return true, 0
		}
	}
	for _, x := range l.leases {
		if now.Before(x.deadline) {
			wait = min(wait, max(x.renewed.Add(x.ttl/3).Sub(now), renewRetry))
			if !x.retiring {
				// Wakes at the deadline to retire the lease.
				wait = min(wait, max(x.deadline.Sub(now), renewRetry))
			}
		}
	}
	return false, wait
}

// renewRetry is the shortest sleep before a renewal: a renewal that failed
// is retried this soon, not in a busy loop.
const renewRetry = 10 * time.Millisecond

// rpcContext bounds each background call, so that a server that hangs
// cannot stop renewals of the other leases for long.
func (l *Leasing) rpcContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

func (l *Leasing) finishGen(gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.doneGen < gen {
		l.doneGen = gen
		close(l.genDone)
		l.genDone = make(chan struct{})
	}
}

type commitWork struct {
	id uint64
	in *inflight
	// fragments: the lease's short free runs when the batch was taken
	// (CommitRequest.fragment_blocks).
	fragments uint64
}

// commitRound commits everything gathered so far and finishes its
// generation. The server takes at most MaxBatch extents per call, so a
// large batch goes out in several calls; the round sends as many as the
// batch needed when it started (plus one), so that a steady stream of new
// allocations cannot keep it going forever.
//
// What the round leaves behind (a commit to resend, a batch past the
// budget, allocations made meanwhile) is due CommitInterval later, or
// sooner when a caller asks.
func (l *Leasing) commitRound() {
	l.mu.Lock()
	gen := l.openGen
	l.openGen++
	l.urgent = false
	l.since = time.Time{}
	budget := (len(l.pending)+len(l.frees))/MaxBatch + 2
	l.mu.Unlock()
	for range budget {
		if !l.commitOnce(gen) {
			break
		}
	}
	l.mu.Lock()
	if l.since.IsZero() && (len(l.pending) > 0 || len(l.frees) > 0 || l.anyInflight()) {
		l.since = time.Now()
	}
	l.mu.Unlock()
	l.finishGen(gen)
}

// commitOnce sends one Commit per lease (and frees without a lease as one
// Free); it reports whether all went through and work remains.
func (l *Leasing) commitOnce(gen uint64) bool {
	l.mu.Lock()
	byLease := make(map[uint64][]Extent)
	for e, id := range l.pending {
		byLease[id] = append(byLease[id], e)
	}
	clear(l.pending)
	frees := l.frees
	l.frees = nil
	var work []commitWork
	for _, x := range l.leases {
		allocs := byLease[x.id]
		delete(byLease, x.id)
		if x.inflight == nil && (len(allocs) > 0 || len(frees) > 0) {
			if len(allocs) > MaxBatch {
				for _, e := range allocs[MaxBatch:] {
					l.pending[e] = x.id
				}
				allocs = allocs[:MaxBatch]
			}
			nf := min(len(frees), MaxBatch-len(allocs))
			x.inflight = &inflight{
				seq:    x.lastSeq + 1,
				allocs: allocs,
				frees:  frees[:nf:nf],
				// Freed blocks are worth keeping only in the lease that
				// serves; a recall or close wants them free on the server.
				recycle: nf > 0 && x == l.servingLocked() && !l.separate.Load() && !l.closing.Load(),
			}
			frees = frees[nf:]
		} else {
			// Waits behind an unacknowledged commit of the same lease.
			for _, e := range allocs {
				l.pending[e] = x.id
			}
		}
		if x.inflight != nil {
			work = append(work, commitWork{x.id, x.inflight, x.engine.fragments})
		}
	}
	// Allocations of leases dropped meanwhile are lost.
	for _, es := range byLease {
		l.stats[statLost].Add(uint64(len(es)))
		l.lost = append(l.lost, es...)
	}
	l.frees = append(l.frees, frees...)
	var direct []Extent
	if len(l.leases) == 0 && len(l.frees) > 0 {
		direct = l.frees[:min(len(l.frees), MaxBatch)]
		l.frees = l.frees[len(direct):]
	}
	l.mu.Unlock()

	ok := true
	if len(direct) > 0 {
		ctx, cancel := l.rpcContext()
		_, err := l.c.Free(ctx, direct...)
		cancel()
		if err != nil {
			ok = false
			// Sent again only when they surely did not run: a free whose
			// outcome is unknown may have run, and sent again it could
			// free blocks allocated since by someone else. It is dropped
			// with the error instead; at worst its blocks stay allocated
			// until a reconcile finds them.
			if errors.Is(err, ErrUnavailable) {
				l.mu.Lock()
				l.frees = append(l.frees, direct...)
				l.mu.Unlock()
			}
			l.noteError(gen, err)
		}
	}
	for _, w := range work {
		l.stats[statCommits].Add(1)
		l.mu.Lock()
		if w.in.sent.IsZero() {
			w.in.sent = time.Now()
		}
		sent := w.in.sent
		l.mu.Unlock()
		ctx, cancel := l.rpcContext()
		r, err := l.c.commit(ctx, &pb.CommitRequest{
			LeaseId:        w.id,
			Sequence:       w.in.seq,
			Allocations:    toPBs(w.in.allocs),
			Frees:          toPBs(w.in.frees),
			RecycleFrees:   w.in.recycle,
			FragmentBlocks: w.fragments,
		})
		cancel()
		l.mu.Lock()
		if err == nil {
			if x := l.find(w.id); x != nil {
				x.lastSeq = w.in.seq
				x.inflight = nil
				// A commit keeps the lease alive as a renewal does; a server
				// that does not say for how long keeps the last TTL.
				ttl := x.ttl
				if r.TtlMs != 0 {
					ttl = ttlOf(r.TtlMs)
				}
				x.extended(sent, ttl, r.MarginMs)
				if r.Recall {
					l.retireLocked(x)
				}
				// The reply that ends the commit's flight adds its recycled
				// blocks, so they are added once even when it answered a
				// resend.
				err = l.recycledLocked(x, w.in, r.Recycled)
			}
			l.mu.Unlock()
			if err != nil {
				ok = false
				l.noteError(gen, err)
			}
			continue
		}
		var ref *RefusedError
		switch {
		case errors.Is(err, ErrUnavailable), errors.Is(err, ErrOutcomeUnknown):
			// Kept in flight: resent as is next round, with the same
			// sequence number, which the server applies once (also after
			// a restart, which keeps the lease). So a commit cut off with
			// its outcome unknown is taken neither as lost (its
			// allocations may be durable) nor as done (they may not).
			// Until the lease's deadline: then its allocations are lost,
			// and its frees are sent again only if they surely did not
			// run (a free that ran twice could free blocks allocated
			// since by someone else).
			w.in.maybeRan = w.in.maybeRan || errors.Is(err, ErrOutcomeUnknown)
			if x := l.find(w.id); x != nil && !time.Now().Before(x.deadline) {
				l.dropLease(w.id, !w.in.maybeRan)
			}
			ok = false
		case errors.As(err, &ref) && ref.LeaseGone():
			// Its frees were never applied: send them again.
			l.dropLease(w.id, true)
			l.mu.Unlock()
			continue
		case errors.As(err, &ref) && len(w.in.frees) > 0:
			// Refused as a whole, nothing of it applied, and the sequence
			// is still the next one: most likely a bad free (of space that
			// is free or not committed). The frees are dropped with the
			// error; the allocations go again alone, so that a caller's
			// bad free does not lose other callers' allocations.
			if x := l.find(w.id); x != nil {
				x.inflight = nil
				if len(w.in.allocs) > 0 {
					x.inflight = &inflight{seq: w.in.seq, allocs: w.in.allocs}
				}
			}
			ok = false
		default:
			// Allocations alone refused: the lease and this client
			// disagree about it. Nothing of the batch is durable, and the
			// lease is left to expire on the server.
			l.dropLease(w.id, false)
			ok = false
		}
		l.mu.Unlock()
		l.noteError(gen, err)
	}
	l.mu.Lock()
	more := len(l.pending) > 0 || len(l.frees) > 0
	l.mu.Unlock()
	return ok && more
}

// recycledLocked adds the blocks a commit's reply recycled into lease x
// (l.mu held). Blocks the server says it recycled but that the commit did
// not free are a bad reply: none are used, and they go back to the server
// with the lease.
func (l *Leasing) recycledLocked(x *localLease, in *inflight, recycled []*pb.Extent) error {
	if len(recycled) == 0 {
		return nil
	}
	if !in.recycle {
		return badReply("lease %d: commit %d recycled blocks it was not asked to", x.id, in.seq)
	}
	es := make([]Extent, len(recycled))
	for i, pe := range recycled {
		e, err := fromPB(pe)
		if err != nil {
			return fmt.Errorf("lease %d: %w", x.id, err)
		}
		es[i] = e
	}
	if err := x.engine.addRecycled(es, in.frees); err != nil {
		return fmt.Errorf("lease %d: %w", x.id, err)
	}
	l.stats[statRecycled].Add(sumExtents(es))
	return nil
}

func (l *Leasing) find(id uint64) *localLease {
	for _, x := range l.leases {
		if x.id == id {
			return x
		}
	}
	return nil
}

func (l *Leasing) noteError(gen uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
		l.unavailGen, l.unavailErr = gen, err
	} else {
		l.refusedErr = err
	}
}

// dropLease forgets a lease the server no longer has (l.mu held); its
// uncommitted allocations are lost.
func (l *Leasing) dropLease(id uint64, resendFrees bool) {
	var lost []Extent
	for i, x := range l.leases {
		if x.id != id {
			continue
		}
		l.leases = append(l.leases[:i], l.leases[i+1:]...)
		if x.inflight != nil {
			lost = append(lost, x.inflight.allocs...)
			if resendFrees && len(x.inflight.frees) > 0 {
				l.frees = append(l.frees, x.inflight.frees...)
				l.gatheredLocked()
			}
		}
		break
	}
	for e, owner := range l.pending {
		if owner == id {
			lost = append(lost, e)
			delete(l.pending, e)
		}
	}
	l.stats[statLost].Add(uint64(len(lost)))
	l.lost = append(l.lost, lost...)
}

// renewRound renews the leases due for it; a recalled lease retires.
func (l *Leasing) renewRound() {
	l.mu.Lock()
	now := time.Now()
	type renewal struct{ id, fragments uint64 }
	var due []renewal
	for _, x := range l.leases {
		// Past its deadline a lease serves nothing more: a renewal would
		// not bring it back.
		if now.Sub(x.renewed) >= x.ttl/3 && now.Before(x.deadline) {
			due = append(due, renewal{x.id, x.engine.fragments})
		}
	}
	l.mu.Unlock()
	for _, d := range due {
		id := d.id
		ctx, cancel := l.rpcContext()
		sent := time.Now()
		r, err := l.c.rpc.Renew(ctx, &pb.RenewRequest{LeaseId: id, FragmentBlocks: d.fragments, Epoch: l.c.epoch.Load()})
		err = statusError(ctx, err)
		if err == nil {
			err = l.c.observe(r.Epoch)
		}
		cancel()
		l.mu.Lock()
		var ref *RefusedError
		switch {
		case err == nil:
			if x := l.find(id); x != nil {
				x.extended(sent, ttlOf(r.TtlMs), r.MarginMs)
				if r.Recall {
					l.retireLocked(x)
				}
			}
		case errors.As(err, &ref) && ref.LeaseGone():
			l.dropLease(id, true)
		}
		l.mu.Unlock()
	}
}

// retireLocked retires a lease (l.mu held): recalled by the server, or
// past MaxLeases. It serves no more allocations, and what it served is
// committed now rather than at the interval, so that it can be released
// soon.
func (l *Leasing) retireLocked(x *localLease) {
	x.retiring = true
	for _, id := range l.pending {
		if id == x.id {
			l.urgent = true
			return
		}
	}
}

// releaseRound releases retiring leases (every lease when closing) once
// nothing of theirs waits to be committed.
func (l *Leasing) releaseRound(closing bool) {
	l.mu.Lock()
	busy := make(map[uint64]bool)
	for _, id := range l.pending {
		busy[id] = true
	}
	var ready []uint64
	for _, x := range l.leases {
		if (x.retiring || closing) && x.inflight == nil && !busy[x.id] {
			ready = append(ready, x.id)
		}
	}
	l.mu.Unlock()
	for _, id := range ready {
		ctx, cancel := l.rpcContext()
		r, err := l.c.rpc.Release(ctx, &pb.ReleaseRequest{LeaseId: id, Epoch: l.c.epoch.Load()})
		err = statusError(ctx, err)
		if err == nil {
			err = l.c.observe(r.Epoch)
		}
		cancel()
		var ref *RefusedError
		l.mu.Lock()
		x := l.find(id)
		// Past its deadline, with nothing to commit, a lease that cannot be
		// released is forgotten: the server expires it.
		expired := x != nil && !time.Now().Before(x.deadline)
		l.mu.Unlock()
		if err == nil || (errors.As(err, &ref) && ref.LeaseGone()) || expired {
			l.mu.Lock()
			for i, x := range l.leases {
				if x.id == id {
					l.leases = append(l.leases[:i], l.leases[i+1:]...)
					break
				}
			}
			l.mu.Unlock()
		}
	}
}

// pause stops the background goroutine (no commits, renewals or releases)
// until the returned function is called: a test's way to let a lease
// expire, or to keep allocations uncommitted across a server restart.
type pause struct {
	acked  chan struct{}
	resume chan struct{}
}

func (l *Leasing) pause() (resume func()) {
	p := &pause{acked: make(chan struct{}), resume: make(chan struct{})}
	l.mu.Lock()
	l.paused = p
	l.mu.Unlock()
	l.notify()
	<-p.acked
	return func() { close(p.resume) }
}
