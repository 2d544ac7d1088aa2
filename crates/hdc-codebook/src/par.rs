//! Scoped data parallelism over disjoint output chunks, with a one-thread fallback where the
//! platform has no threads (wasm32).

/// Threads to use: the machine's parallelism, or 1 where it is unknown.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(64)
}

/// Runs `f(start_item, chunk)` over `out` split into per-thread chunks of whole items of
/// `item` elements each.
pub(crate) fn for_chunks<T: Send>(out: &mut [T], item: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let items = out.len() / item.max(1);
    let t = threads().min(items.div_ceil(4096)).max(1);
    if t == 1 {
        f(0, out);
        return;
    }
    let per = items.div_ceil(t) * item;
    std::thread::scope(|s| {
        for (i, chunk) in out.chunks_mut(per).enumerate() {
            let f = &f;
            s.spawn(move || f(i * per / item, chunk));
        }
    });
}
