//! What both benches share.

/// The middle sample (`None` for none).
pub(crate) fn median<T: Copy + PartialOrd>(mut samples: Vec<T>) -> Option<T> {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    samples.get(samples.len() / 2).copied()
}
