//! Idle polling (`[server] idle_poll_us`): keeps the machine's CPUs awake
//! for a moment after each call, so that the next request and the reply
//! wake threads on running CPUs.
//!
//! On a virtual machine whose idle vCPUs halt at once (the guest's halt
//! polling off, as on Firecracker by default), every wake of a thread on an
//! idle vCPU is an exit to the host: tens of µs, several per call (the
//! server's reader, its worker, the client's thread). A CPU that runs
//! something is woken by the host's scheduler in a fraction of that. With a
//! window `w`, the server runs one *poller* thread per CPU it may use,
//! pinned to it at the lowest priority (`SCHED_IDLE`, else nice 19):
//! after each call starts it spins until no call has started for `w`, then
//! sleeps until the next call. It spins on plain instructions, not the
//! `pause` of [`std::hint::spin_loop`]: a vCPU that executes many pauses
//! exits to the host too (pause-loop exiting), which is what polling is
//! meant to avoid. Any runnable thread preempts a poller, so work is not
//! delayed; the cost is CPU time while calls keep coming (the CPUs never
//! idle then), the power that costs, and on a busy host a vCPU that the
//! host deschedules more readily. Off by default; the guest's own halt
//! polling (`/sys/module/haltpoll/parameters/guest_halt_poll_ns`) does the
//! same for every program where an operator can set it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a sleeping poller waits before it looks again on its own (a
/// safety net: a call wakes it at once). Far longer in the tests than
/// their waits, so that they see the call's wake-up and not this one.
const NAP: Duration = Duration::from_secs(if cfg!(test) { 3600 } else { 1 });

/// Spin steps between two looks at the clock.
const SPINS: u32 = 64;

/// The pollers of a server; they stop and are joined on drop.
pub(crate) struct IdlePoll {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    /// How long the pollers spin after the latest call started.
    window_ns: u64,
    epoch: Instant,
    /// When the latest call started, in ns since `epoch` (+1, so that 0
    /// means none yet).
    last: AtomicU64,
    /// Pollers asleep (or about to be).
    sleeping: AtomicUsize,
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    /// Spin rounds made, for the tests.
    #[cfg(test)]
    rounds: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX) + 1
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl IdlePoll {
    /// Starts one poller per CPU this process may run on (at least one),
    /// each spinning for `window` after every [`touch`](Self::touch).
    /// A poller that cannot be pinned or lowered in priority still runs
    /// (unpinned, or at its default priority); one that cannot be started
    /// is left out, and the error is returned only when none started.
    ///
    /// # Errors
    /// The thread spawn error when no poller could be started.
    pub(crate) fn start(window: Duration) -> std::io::Result<IdlePoll> {
        let shared = Arc::new(Shared {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            sleeping: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            #[cfg(test)]
            rounds: AtomicU64::new(0),
        });
        let cpus: Vec<Option<usize>> = match rustix::thread::sched_getaffinity(None) {
            Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&c| set.is_set(c))
                .map(Some)
                .collect(),
            Err(_) => Vec::new(),
        };
        let cpus = if cpus.is_empty() { vec![None] } else { cpus };
        let mut threads = Vec::with_capacity(cpus.len());
        let mut first_error = None;
        for cpu in cpus {
            let s = Arc::clone(&shared);
            let name = match cpu {
                Some(c) => format!("idle-poll-{c}"),
                None => "idle-poll".to_string(),
            };
            match std::thread::Builder::new()
                .name(name)
                .stack_size(64 << 10)
                .spawn(move || poll(&s, cpu))
            {
                Ok(t) => threads.push(t),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if threads.is_empty() => Err(e),
            _ => Ok(IdlePoll { shared, threads }),
        }
    }

    /// A call started: the pollers spin for another window (and wake if
    /// they slept).
    pub(crate) fn touch(&self) {
        let s = &self.shared;
        s.last.store(s.now_ns(), Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.guard();
            s.wake.notify_all();
        }
    }

    /// How many pollers run.
    pub(crate) fn pollers(&self) -> usize {
        self.threads.len()
    }
}

impl Drop for IdlePoll {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.guard();
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One poller: pinned to `cpu` (when known) at the lowest priority, it
/// spins while a call started within the window and sleeps otherwise.
fn poll(s: &Shared, cpu: Option<usize>) {
    if let Some(c) = cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(c);
        let _ = rustix::thread::sched_setaffinity(None, &set);
    }
    // SCHED_IDLE: runs only when nothing else wants the CPU; else nice 19.
    let idle = thread_priority::unix::set_thread_priority_and_policy(
        thread_priority::unix::thread_native_id(),
        thread_priority::ThreadPriority::Min,
        thread_priority::unix::ThreadSchedulePolicy::Normal(
            thread_priority::unix::NormalThreadSchedulePolicy::Idle,
        ),
    );
    if idle.is_err() {
        let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19);
    }
    while !s.stop.load(Ordering::Relaxed) {
        let last = s.last.load(Ordering::SeqCst);
        if last != 0 && s.now_ns().saturating_sub(last) < s.window_ns {
            for i in 0..SPINS {
                std::hint::black_box(i);
            }
            #[cfg(test)]
            s.rounds.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // Idle: sleep until a call starts. Counted as asleep before the
        // second look at `last`, so that a call either sees the count and
        // wakes it, or is seen here.
        let g = s.guard();
        s.sleeping.fetch_add(1, Ordering::SeqCst);
        if s.last.load(Ordering::SeqCst) == last && !s.stop.load(Ordering::SeqCst) {
            let _ = s.wake.wait_timeout(g, NAP);
        } else {
            drop(g);
        }
        s.sleeping.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (at most a minute: the pollers run at the lowest priority,
    /// and a busy machine runs them seldom) until `cond` holds.
    fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(60), "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn pollers_spin_after_a_call_and_sleep_when_calls_stop() {
        let window = Duration::from_millis(100);
        let p = IdlePoll::start(window).unwrap();
        let n = p.pollers();
        assert!(n >= 1);
        let s = &p.shared;
        // No call yet: every poller asleep, none spinning.
        wait_for("all asleep", || s.sleeping.load(Ordering::SeqCst) == n);
        let before = s.rounds.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            s.rounds.load(Ordering::Relaxed),
            before,
            "spinning without calls"
        );
        // Calls: they wake and spin. Calls keep coming while the test
        // waits, as a poller at the lowest priority on a busy machine may
        // first run after one call's window has passed (it then rightly
        // sleeps again).
        wait_for("spinning", || {
            p.touch();
            s.rounds.load(Ordering::Relaxed) > before
        });
        // Calls keep them awake; when calls stop they sleep again and
        // spin no more.
        for _ in 0..5 {
            p.touch();
            std::thread::sleep(Duration::from_millis(10));
        }
        // A window after the last call no poller spins any more, even one
        // that read an older call's time and was then held up (a poller
        // counted asleep may still be on its way back to spin until then).
        std::thread::sleep(window);
        wait_for("asleep again", || s.sleeping.load(Ordering::SeqCst) == n);
        let slept = s.rounds.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            s.rounds.load(Ordering::Relaxed),
            slept,
            "spinning while asleep"
        );
        drop(p); // stops and joins them
    }

    #[test]
    fn a_touch_wakes_sleeping_pollers_before_their_nap_ends() {
        let p = IdlePoll::start(Duration::from_millis(200)).unwrap();
        let n = p.pollers();
        let s = &p.shared;
        wait_for("all asleep", || s.sleeping.load(Ordering::SeqCst) == n);
        p.touch();
        // Within `wait_for`'s minute, far less than the nap.
        wait_for("awake", || s.sleeping.load(Ordering::SeqCst) < n);
    }
}
