//! Data parallelism over disjoint output chunks on the workspace's one thread pool (rayon's
//! global pool, sized by the front end). On targets without threads (wasm32) rayon runs on
//! the calling thread; a worker's panic is resumed on the caller.

use rayon::prelude::*;

/// Runs `f(start_item, chunk)` over `out` split into chunks of whole items of `item`
/// elements each, one chunk per pool thread (at least 4096 items per chunk).
pub(crate) fn for_chunks<T: Send>(out: &mut [T], item: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let items = out.len() / item.max(1);
    let t = rayon::current_num_threads()
        .min(items.div_ceil(4096))
        .max(1);
    if t == 1 {
        f(0, out);
        return;
    }
    let per = items.div_ceil(t) * item;
    out.par_chunks_mut(per)
        .enumerate()
        .for_each(|(i, chunk)| f(i * per / item, chunk));
}
