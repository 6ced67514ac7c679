//! A persistent thread pool running SPMD launches: `run(n, f)` calls `f(block)` for every block
//! in `0..n` across the workers and the calling thread, and returns when all are done.

use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

type Job = &'static (dyn Fn(usize) + Sync);

/// Spin iterations before sleeping (about 20-50 us on current x86 cores).
const SPIN_LIMIT: u32 = 1 << 15;

/// One launch: blocks are split into one contiguous chunk per participant (the caller is
/// participant 0, worker `i` is participant `i`), so the same rows of consecutive kernels run on
/// the same core and a kernel finds its producer's output in that core's cache. A participant
/// that finishes its chunk steals from the others' (each chunk has its own claim cursor).
struct Launch {
    job: Job,
    n: usize,
    chunks: Vec<(AtomicUsize, usize)>,
    done: AtomicUsize,
}

impl Launch {
    fn new(job: Job, n: usize, parts: usize) -> Launch {
        let chunks =
            (0..parts).map(|p| (AtomicUsize::new(p * n / parts), (p + 1) * n / parts)).collect();
        Launch { job, n, chunks, done: AtomicUsize::new(0) }
    }
}

struct State {
    epoch: u64,
    launch: Option<Arc<Launch>>,
}

pub struct Pool {
    threads: usize,
    /// Mirror of `state.epoch` that idle workers spin on before they sleep.
    epoch: AtomicU64,
    state: Mutex<State>,
    wake: Condvar,
    finished: Condvar,
    /// Serialises launches (one SPMD region at a time).
    gate: Mutex<()>,
}

/// The process-wide pool; `AUTOFUSION_THREADS` overrides the size (default: available cores).
pub fn pool() -> &'static Pool {
    static POOL: Lazy<&'static Pool> = Lazy::new(|| {
        let n = std::env::var("AUTOFUSION_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n >= 1)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        Pool::start(n)
    });
    &POOL
}

/// Run blocks of `l` as participant `me`: its own chunk first, then whatever is left of the others.
fn work(l: &Launch, me: usize) -> usize {
    let parts = l.chunks.len();
    let mut did = 0;
    for i in 0..parts {
        let (next, end) = &l.chunks[(me + i) % parts];
        loop {
            let b = next.fetch_add(1, Ordering::Relaxed);
            if b >= *end {
                break;
            }
            (l.job)(b);
            did += 1;
        }
    }
    did
}

impl Pool {
    fn start(threads: usize) -> &'static Pool {
        let p: &'static Pool = Box::leak(Box::new(Pool {
            threads,
            epoch: AtomicU64::new(0),
            state: Mutex::new(State { epoch: 0, launch: None }),
            wake: Condvar::new(),
            finished: Condvar::new(),
            gate: Mutex::new(()),
        }));
        for i in 1..threads {
            std::thread::Builder::new()
                .name(format!("autofusion-{i}"))
                .spawn(move || p.worker(i))
                .expect("spawn pool thread");
        }
        p
    }
    pub fn threads(&self) -> usize {
        self.threads
    }
    fn worker(&self, me: usize) {
        let mut seen = 0;
        loop {
            // Back-to-back launches (a layer's kernels) find the worker awake: spin a little
            // (tens of microseconds) before sleeping on the condition variable.
            let mut spins = 0u32;
            while self.epoch.load(Ordering::Acquire) == seen && spins < SPIN_LIMIT {
                std::hint::spin_loop();
                spins += 1;
            }
            let launch = {
                let mut st = self.state.lock().unwrap();
                while st.epoch == seen {
                    st = self.wake.wait(st).unwrap();
                }
                seen = st.epoch;
                st.launch.clone()
            };
            if let Some(l) = launch {
                let did = work(&l, me);
                if did > 0 && l.done.fetch_add(did, Ordering::AcqRel) + did == l.n {
                    let _g = self.state.lock().unwrap();
                    self.finished.notify_all();
                }
            }
        }
    }
    /// Run `f(block)` for `block` in `0..n`.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if n == 1 || self.threads == 1 {
            (0..n).for_each(f);
            return;
        }
        let _gate = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the launch is finished (every block ran) before this function returns, and
        // workers drop their reference to the job right after their last block.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
        let l = Arc::new(Launch::new(job, n, self.threads));
        {
            let mut st = self.state.lock().unwrap();
            st.epoch += 1;
            st.launch = Some(l.clone());
            self.epoch.store(st.epoch, Ordering::Release);
            self.wake.notify_all();
        }
        let did = work(&l, 0);
        l.done.fetch_add(did, Ordering::AcqRel);
        let mut spins = 0u32;
        while l.done.load(Ordering::Acquire) < n && spins < SPIN_LIMIT {
            std::hint::spin_loop();
            spins += 1;
        }
        let mut st = self.state.lock().unwrap();
        while l.done.load(Ordering::Acquire) < n {
            st = self.finished.wait(st).unwrap();
        }
        st.launch = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_block_runs_once() {
        let p = pool();
        for n in [1usize, 2, 3, 17, 1000] {
            let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            p.run(n, &|b| {
                hits[b].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
    }
}
