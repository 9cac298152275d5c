//! Files of a checkpoint on every core: a save writes (and hashes) them,
//! `verify` checks and a load reads them through the same bounded pool of
//! threads, one file per thread at a time. SHA-256 runs on one core per
//! stream, so the files of a checkpoint (its shards, `shards.rs`) are what
//! lets hashing use the node's cores.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Most files handled at once: the manifest is untrusted, and a thread for
/// each file it lists would let one of 100 000 names exhaust the kernel's
/// threads and mappings (and a failed spawn aborts).
const MAX_FILE_THREADS: usize = 32;

/// Files handled at once: the cores this process may use (at least 2, so
/// that I/O of one file overlaps the hash of another on a single core; at
/// most [`MAX_FILE_THREADS`]).
pub(super) fn file_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, MAX_FILE_THREADS)
}

/// `f` of every item, in order, on at most `threads` threads that take the
/// next item as they finish one (items are taken in the order of `order`,
/// the indices of `items`, e.g. the largest first). A panic in `f` (a
/// simulated crash) propagates like one.
pub(super) fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    order: &[usize],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..order.len().min(threads.max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) else { return done };
                        done.push((i, f(&items[i])));
                    }
                })
            })
            .collect();
        for worker in workers {
            for (i, result) in worker.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                slots[i] = Some(result);
            }
        }
    });
    slots.into_iter().map(|r| r.expect("every item was handled")).collect()
}

/// The indices of `sizes`, largest first (ties in order): handing the
/// largest files out first keeps one big file from starting last and
/// running alone.
pub(super) fn largest_first(sizes: &[u64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_handled_once_in_item_order_whatever_the_order_taken() {
        let items: Vec<u64> = (0..50).collect();
        let order = largest_first(&items);
        assert_eq!(order[..3], [49, 48, 47]);
        let out = in_parallel(&items, &order, 4, |x| x * 2);
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(largest_first(&[3, 9, 3, 1]), [1, 0, 2, 3], "ties keep their order");
        assert!(in_parallel(&[] as &[u8], &[], 4, |x| *x).is_empty());
        assert!((2..=MAX_FILE_THREADS).contains(&file_threads()));
    }
}
