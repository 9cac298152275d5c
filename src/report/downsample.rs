//! Charts of a long run from bounded memory: the points of a series are
//! taken one at a time (as `metrics.jsonl` is streamed) into at most
//! [`MAX_BUCKETS`] buckets of consecutive points, each keeping the point of
//! its lowest value, of its highest and its last, so a spike or a dip is
//! drawn whatever the run's length while memory and the page stay bounded
//! (at most 3 × [`MAX_BUCKETS`] points a series). When the buckets are full,
//! neighbours are merged in pairs and each new bucket takes twice as many
//! points. A run shorter than [`MAX_BUCKETS`] points keeps every point.
//! Pure: no I/O, tested on its own.

/// The most buckets a series keeps.
pub const MAX_BUCKETS: usize = 1000;

/// A point of a bucket, with its place in the input (what orders and
/// tells apart the points a bucket keeps).
#[derive(Debug, Clone)]
struct Seen<P> {
    seq: u64,
    value: Option<f64>,
    point: P,
}

#[derive(Debug, Clone)]
struct Bucket<P> {
    low: Option<Seen<P>>,
    high: Option<Seen<P>>,
    last: Seen<P>,
}

impl<P: Clone> Bucket<P> {
    fn of(seen: Seen<P>) -> Bucket<P> {
        let valued = seen.value.is_some().then(|| seen.clone());
        Bucket { low: valued.clone(), high: valued, last: seen }
    }

    /// `self` followed by `next`.
    fn merge(self, next: Bucket<P>) -> Bucket<P> {
        let pick = |a: Option<Seen<P>>, b: Option<Seen<P>>, lower: bool| match (a, b) {
            (Some(a), Some(b)) => {
                let (va, vb) = (a.value.unwrap_or(f64::NAN), b.value.unwrap_or(f64::NAN));
                Some(if (vb < va) == lower && vb != va { b } else { a })
            }
            (a, b) => a.or(b),
        };
        Bucket { low: pick(self.low, next.low, true), high: pick(self.high, next.high, false), last: next.last }
    }

    /// Its distinct points, in input order.
    fn points(self) -> Vec<Seen<P>> {
        let mut out: Vec<Seen<P>> = Vec::with_capacity(3);
        for s in [self.low, self.high, Some(self.last)].into_iter().flatten() {
            if !out.iter().any(|o| o.seq == s.seq) {
                out.push(s);
            }
        }
        out.sort_by_key(|s| s.seq);
        out
    }
}

/// A series being downsampled (module header). `value` is what a bucket's
/// lowest and highest point are chosen by (the loss of a training line).
#[derive(Debug)]
pub struct Downsample<P> {
    value: fn(&P) -> Option<f64>,
    buckets: Vec<Bucket<P>>,
    /// Points each full bucket takes.
    width: u64,
    /// The bucket being filled and how many points it took.
    filling: Option<(Bucket<P>, u64)>,
    seen: u64,
}

impl<P: Clone> Downsample<P> {
    pub fn new(value: fn(&P) -> Option<f64>) -> Downsample<P> {
        Downsample { value, buckets: Vec::new(), width: 1, filling: None, seen: 0 }
    }

    pub fn push(&mut self, point: P) {
        let seen = Seen { seq: self.seen, value: (self.value)(&point).filter(|v| v.is_finite()), point };
        self.seen += 1;
        let (bucket, n) = match self.filling.take() {
            Some((bucket, n)) => (bucket.merge(Bucket::of(seen)), n + 1),
            None => (Bucket::of(seen), 1),
        };
        if n < self.width {
            self.filling = Some((bucket, n));
            return;
        }
        self.buckets.push(bucket);
        if self.buckets.len() >= MAX_BUCKETS {
            let full = std::mem::take(&mut self.buckets);
            let mut pairs = full.into_iter();
            while let Some(a) = pairs.next() {
                self.buckets.push(match pairs.next() {
                    Some(b) => a.merge(b),
                    None => a,
                });
            }
            self.width *= 2;
        }
    }

    /// How many points were pushed.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The points kept, in input order.
    pub fn finish(self) -> Vec<P> {
        let last = self.filling.map(|(b, _)| b);
        self.buckets.into_iter().chain(last).flat_map(Bucket::points).map(|s| s.point).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampled(values: impl IntoIterator<Item = f64>) -> (Vec<(u64, f64)>, u64) {
        let mut d = Downsample::new(|p: &(u64, f64)| Some(p.1));
        for (i, v) in values.into_iter().enumerate() {
            d.push((i as u64, v));
        }
        let seen = d.seen();
        (d.finish(), seen)
    }

    #[test]
    fn a_short_series_keeps_every_point() {
        let (kept, seen) = sampled((0..MAX_BUCKETS - 1).map(|i| i as f64));
        assert_eq!(seen as usize, MAX_BUCKETS - 1);
        assert_eq!(kept.len(), MAX_BUCKETS - 1);
        assert!(kept.iter().enumerate().all(|(i, p)| p.0 == i as u64));
    }

    #[test]
    fn a_long_series_stays_bounded_and_keeps_its_extremes_and_its_last_point() {
        let n = 1_000_000u64;
        let (kept, seen) = sampled((0..n).map(|i| match i {
            123_457 => 1e6,  // a spike
            654_321 => -1e6, // a dip
            _ => (i % 7) as f64,
        }));
        assert_eq!(seen, n);
        assert!(kept.len() <= 3 * MAX_BUCKETS, "{} points", kept.len());
        assert!(kept.len() >= MAX_BUCKETS / 2, "{} points", kept.len());
        assert!(kept.contains(&(123_457, 1e6)) && kept.contains(&(654_321, -1e6)), "extremes drawn");
        assert_eq!(kept.last(), Some(&(n - 1, ((n - 1) % 7) as f64)), "the newest point drawn");
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "in input order, each once");
    }

    #[test]
    fn points_without_a_value_are_kept_as_a_buckets_last() {
        let mut d = Downsample::new(|p: &(u64, Option<f64>)| p.1);
        for i in 0..10_000u64 {
            d.push((i, None));
        }
        let kept = d.finish();
        assert!(!kept.is_empty() && kept.len() <= MAX_BUCKETS, "{}", kept.len());
        assert_eq!(kept.last().map(|p| p.0), Some(9_999));
    }
}
