//! The workspace's one thread pool (rayon's global pool, sized by the front end's knob) as
//! this crate uses it. On targets without threads (wasm32) rayon runs everything on the
//! calling thread. A worker's panic is resumed on the caller, never turned into an error.

use rayon::prelude::*;

/// Threads of the pool.
pub(crate) fn threads() -> usize {
    rayon::current_num_threads()
}

/// `f` over `items` on the pool, results in input order.
pub(crate) fn map<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
    items.into_par_iter().map(f).collect()
}
